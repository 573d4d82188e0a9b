//! The one place that knows the SQL text ([`calls`], [`install`]), the names the
//! functions raise ([`names`]) and how answers are read ([`decode`]), plus the
//! [`execute`] step and the [`input`] checks. It depends on nothing else in the crate.

pub(crate) mod calls;
pub(crate) mod decode;
pub(crate) mod execute;
pub(crate) mod input;
pub(crate) mod install;
pub(crate) mod names;
