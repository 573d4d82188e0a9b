//! Which user the server runs as: this process's own, or `postgres` when
//! this process is root (PostgreSQL refuses to run as root).

use std::fs;

use crate::error::{io_err, LocalServerError};
use crate::procfs::effective_uid;

/// The system user the server runs as when this process is root; the
/// `postgresql` packages create it.
pub(crate) const SERVER_USER: &str = "postgres";

/// `Some((uid, gid))` of [`SERVER_USER`] when running as root, `None` when
/// the server can run as the current user.
pub(crate) fn server_identity() -> Result<Option<(u32, u32)>, LocalServerError> {
    if effective_uid() != Some(0) {
        return Ok(None);
    }
    let passwd = fs::read_to_string("/etc/passwd").map_err(io_err("read /etc/passwd"))?;
    let identity = entries(&passwd)
        .find_map(|(name, uid, gid)| (name == SERVER_USER).then_some(uid.zip(gid)).flatten());
    identity.map(Some).ok_or(LocalServerError::NoServerUser)
}

/// The name of user `uid` in /etc/passwd, else the number, for messages.
pub(crate) fn user_name(uid: u32) -> String {
    name_in("/etc/passwd", uid)
}

/// The name of group `gid` in /etc/group, else the number, for messages.
pub(crate) fn group_name(gid: u32) -> String {
    name_in("/etc/group", gid)
}

/// `name:password:ID:...` files: the name whose third field is `id`.
fn name_in(file: &str, id: u32) -> String {
    fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            entries(&text).find_map(|(name, found, _)| (found == Some(id)).then(|| name.to_owned()))
        })
        .unwrap_or_else(|| id.to_string())
}

/// The name and the third and fourth fields (`None` where not a number) of
/// each entry of a `name:password:ID:ID:...` file (/etc/passwd, /etc/group).
fn entries(text: &str) -> impl Iterator<Item = (&str, Option<u32>, Option<u32>)> {
    text.lines().filter_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let id = fields.next().and_then(|field| field.parse().ok());
        let gid = fields.next().and_then(|field| field.parse().ok());
        Some((name, id, gid))
    })
}
