//! How long a token may be on a given store: the fence record lives in the
//! object's user metadata, and S3 caps that at 2 KB per object, so a token
//! that does not fit must be refused before any request, not half-written
//! or answered with an opaque 400 from the store.

use object_store::path::Path;

use crate::error::FenceError;
use crate::{FencingToken, META_EPOCH, META_TOKEN, META_WRITE_ID};

/// S3's limit on an object's user-defined metadata: the UTF-8 bytes of
/// every name and value added up.
pub const S3_USER_METADATA_BYTES: usize = 2048;

/// What S3 puts in front of each user-metadata name on the wire. Whether
/// S3 counts it toward [`S3_USER_METADATA_BYTES`] is not spelled out, so it
/// is counted (the conservative reading).
const S3_METADATA_PREFIX: &str = "x-amz-meta-";

/// The longest decimal epoch (`i64::MAX` has 19 digits).
const EPOCH_DIGITS: usize = 19;

/// Length of a write id (128 random bits in hex).
pub(crate) const WRITE_ID_LEN: usize = 32;

/// Metadata bytes kept free for entries a later version may add.
const S3_METADATA_MARGIN: usize = 128;

/// The longest token text form ([`FencingToken`]'s `Display`,
/// `lh1.<epoch>.<key>.<owner>` with key and owner percent-encoded) that
/// fits S3's user-metadata limit next to the rest of the fence record:
/// 2048 bytes minus the three metadata names with their `x-amz-meta-`
/// prefix (3 × 26), the longest epoch value (19), the write id (32) and a
/// margin of 128 for later entries: **1791 bytes**.
///
/// With `lh1.`, the two other dots and a 19-digit epoch taken off, the
/// percent-encoded key plus owner may be up to 1766 bytes (a few more at
/// smaller epochs). A key of
/// plain ASCII letters, digits, `-`, `_` and `~` is its own encoding; any
/// other byte takes three. So leasehold's 16 KiB keys do not all fit:
/// such tokens get [`FenceError::TokenTooLong`] on S3.
pub const S3_MAX_TOKEN_TEXT: usize = S3_USER_METADATA_BYTES
    - 3 * S3_METADATA_PREFIX.len()
    - META_EPOCH.len()
    - META_TOKEN.len()
    - META_WRITE_ID.len()
    - EPOCH_DIGITS
    - WRITE_ID_LEN
    - S3_METADATA_MARGIN;

/// Refuses `token` if its text form is longer than `max` (no limit when
/// `None`).
pub(crate) fn check_token_len(
    location: &Path,
    token: &FencingToken,
    max: Option<usize>,
) -> Result<(), FenceError> {
    let Some(max) = max else {
        return Ok(());
    };
    let token_len = token.to_string().len();
    if token_len > max {
        return Err(FenceError::TokenTooLong {
            resource: location.to_string(),
            token_len,
            max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_s3_token_limit_is_the_documented_number() {
        assert_eq!(S3_MAX_TOKEN_TEXT, 1791);
    }

    #[test]
    fn a_token_at_the_s3_limit_fits_the_metadata_with_its_margin() {
        let owner = "o";
        let overhead = FencingToken::new("k", owner, i64::MAX.into())
            .map(|t| t.to_string().len() - 1)
            .unwrap_or(usize::MAX);
        let key = "k".repeat(S3_MAX_TOKEN_TEXT - overhead);
        let token = FencingToken::new(&key, owner, i64::MAX.into());
        let Ok(token) = token else {
            panic!("token rejected: {token:?}");
        };
        let text = token.to_string();
        assert_eq!(text.len(), S3_MAX_TOKEN_TEXT);
        let used: usize = [
            (META_EPOCH, i64::MAX.to_string()),
            (META_TOKEN, text),
            (META_WRITE_ID, "f".repeat(WRITE_ID_LEN)),
        ]
        .iter()
        .map(|(name, value)| S3_METADATA_PREFIX.len() + name.len() + value.len())
        .sum();
        assert_eq!(used + S3_METADATA_MARGIN, S3_USER_METADATA_BYTES);
        let path = Path::from("o");
        assert!(check_token_len(&path, &token, Some(S3_MAX_TOKEN_TEXT)).is_ok());
        let longer = FencingToken::new(&format!("{key}k"), owner, i64::MAX.into());
        let Ok(longer) = longer else {
            panic!("token rejected: {longer:?}");
        };
        assert!(matches!(
            check_token_len(&path, &longer, Some(S3_MAX_TOKEN_TEXT)),
            Err(FenceError::TokenTooLong {
                token_len: 1792,
                max: 1791,
                ..
            })
        ));
    }
}
