//! [`Epoch`]: a grant's fencing number as its own type, so no other 64-bit number
//! (a generation, a row count) can be passed where an epoch is meant.

use std::fmt;
use std::num::ParseIntError;
use std::str::FromStr;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::BigInt;

/// A fencing epoch: strictly greater for every later grant of a key, even after a
/// crash; grants start at 1, `0` means "nothing yet".
/// Compares with integers, prints as its number, maps to SQL `bigint`.
///
/// ```
/// use leasehold::Epoch;
/// let epoch = Epoch::new(7);
/// assert_eq!(epoch, 7);
/// assert!(epoch > Epoch::new(6));
/// assert_eq!(epoch.to_string(), "7");
/// assert_eq!("7".parse::<Epoch>().unwrap().get(), 7);
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, AsExpression, FromSqlRow,
)]
#[diesel(sql_type = BigInt)]
pub struct Epoch(pub i64);

impl Epoch {
    /// The epoch numbered `value`; calls that take an epoch check its range.
    pub const fn new(value: i64) -> Self {
        Epoch(value)
    }

    /// The number, as the SQL functions take it.
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl From<i64> for Epoch {
    fn from(value: i64) -> Self {
        Epoch(value)
    }
}

impl From<Epoch> for i64 {
    fn from(epoch: Epoch) -> Self {
        epoch.0
    }
}

impl PartialEq<i64> for Epoch {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

impl PartialEq<Epoch> for i64 {
    fn eq(&self, other: &Epoch) -> bool {
        *self == other.0
    }
}

impl PartialOrd<i64> for Epoch {
    fn partial_cmp(&self, other: &i64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl PartialOrd<Epoch> for i64 {
    fn partial_cmp(&self, other: &Epoch) -> Option<std::cmp::Ordering> {
        self.partial_cmp(&other.0)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for Epoch {
    type Err = ParseIntError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Epoch)
    }
}

impl ToSql<BigInt, Pg> for Epoch {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <i64 as ToSql<BigInt, Pg>>::to_sql(&self.0, out)
    }
}

impl FromSql<BigInt, Pg> for Epoch {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        <i64 as FromSql<BigInt, Pg>>::from_sql(bytes).map(Epoch)
    }
}
