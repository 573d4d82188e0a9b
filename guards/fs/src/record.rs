//! [`FenceRecord`] and the one-line header that stores it in front of the
//! payload (format in the crate docs): writing it and parsing it back.

use std::io::{self, BufRead, BufReader, Read};

use leasehold::__private::field_text::{decode as percent_decode, encode as percent_encode};

/// Version tag that opens every header.
const MAGIC: &str = "lhfs1";
/// Upper bound on the header line; a longer one is reported as corrupt.
const MAX_HEADER_LEN: u64 = 64 * 1024;

/// What a fenced file's header stores (G1): the key, the epoch of the
/// current payload and the fence. Callers see it as a
/// [`GuardRecord`](leasehold::guard::GuardRecord), the one record type of
/// every guard ([`FenceRecord::guard_record`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FenceRecord {
    /// The lease key the file is fenced by; tokens of other keys are refused.
    pub(crate) key: String,
    /// The highest epoch whose write was accepted: the epoch of the current
    /// payload. `0` if the file was created or fenced but never written.
    pub(crate) epoch: i64,
    /// The floor raised by [`FencedFile::fence`](crate::FencedFile::fence):
    /// every epoch up to and including this one is refused. `0` if never
    /// raised.
    pub(crate) fenced_through: i64,
}

impl FenceRecord {
    pub(crate) fn new(key: &str, epoch: i64, fenced_through: i64) -> Self {
        Self {
            key: key.to_owned(),
            epoch,
            fenced_through,
        }
    }

    /// Whether a write with `epoch` would be admitted by this record (key
    /// aside): at or above the accepted epoch and above the fenced floor.
    pub(crate) fn admits(&self, epoch: i64) -> bool {
        epoch >= self.epoch && epoch > self.fenced_through
    }

    /// The record as every guard reports it: the key, and the lowest epoch
    /// admitted (the payload's epoch or one above the fence, whichever is
    /// higher), the one epoch [`FenceRecord::admits`] starts at.
    pub(crate) fn guard_record(&self) -> leasehold::guard::GuardRecord {
        leasehold::guard::GuardRecord {
            lease_key: self.key.clone(),
            accepted_epoch: leasehold::Epoch::new(
                self.epoch.max(self.fenced_through.saturating_add(1)),
            ),
        }
    }
}

/// Why a header could not be read: the file could not be read, or what was
/// read is not a fenced file (the reason says what exactly).
pub(crate) enum HeaderError {
    Io(io::Error),
    Corrupt(String),
}

/// The header line for `record` in front of `payload_len` payload bytes.
pub(crate) fn encode_header(record: &FenceRecord, payload_len: usize) -> String {
    format!(
        "{MAGIC} {} {} {} {}\n",
        record.epoch,
        record.fenced_through,
        payload_len,
        percent_encode(&record.key)
    )
}

/// Parses the header from `reader`, checking that the total file length
/// `file_len` matches; returns the record and the payload length, leaving
/// `reader` at the payload.
pub(crate) fn parse_header<R: Read>(
    reader: &mut BufReader<R>,
    file_len: u64,
) -> Result<(FenceRecord, u64), HeaderError> {
    let corrupt = |reason: String| HeaderError::Corrupt(reason);
    let mut line = Vec::new();
    reader
        .by_ref()
        .take(MAX_HEADER_LEN)
        .read_until(b'\n', &mut line)
        .map_err(HeaderError::Io)?;
    if line.pop() != Some(b'\n') {
        return Err(corrupt(
            "no header line: the file is empty, truncated, or was not written by leasehold-fs"
                .to_owned(),
        ));
    }
    let line = std::str::from_utf8(&line)
        .map_err(|_| corrupt("the header line is not ASCII".to_owned()))?;
    let fields: Vec<&str> = line.split(' ').collect();
    let [magic, epoch, fenced_through, payload_len, key] = fields[..] else {
        return Err(corrupt(format!(
            "the header has {} fields, expected 5 (lhfs1 <epoch> <fenced_through> <len> <key>)",
            fields.len()
        )));
    };
    if magic != MAGIC {
        return Err(corrupt(format!(
            "unknown header tag {magic:?}, expected {MAGIC:?}"
        )));
    }
    let number = |text: &str, what: &str| -> Result<u64, HeaderError> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(corrupt(format!("{what} {text:?} is not a decimal number")));
        }
        text.parse::<u64>()
            .map_err(|_| corrupt(format!("{what} {text:?} is out of range")))
    };
    let epoch = i64::try_from(number(epoch, "epoch")?)
        .map_err(|_| corrupt("epoch is out of range".to_owned()))?;
    let fenced_through = i64::try_from(number(fenced_through, "fenced_through")?)
        .map_err(|_| corrupt("fenced_through is out of range".to_owned()))?;
    let payload_len = number(payload_len, "payload length")?;
    let key = percent_decode(key)
        .ok_or_else(|| corrupt("the lease key is not validly percent-encoded".to_owned()))?;
    if key.is_empty() {
        return Err(corrupt("the lease key is empty".to_owned()));
    }
    let header_len = line.len() as u64 + 1;
    if header_len.checked_add(payload_len) != Some(file_len) {
        return Err(corrupt(format!(
            "the header announces {payload_len} payload bytes but the file holds {}",
            file_len.saturating_sub(header_len)
        )));
    }
    Ok((
        FenceRecord {
            key,
            epoch,
            fenced_through,
        },
        payload_len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_encoding_round_trips_awkward_keys() {
        for key in ["plain", "with space", "a.b/c", "ä%20\n", "x y\tz"] {
            let encoded = percent_encode(key);
            assert!(!encoded.contains([' ', '\n']));
            assert_eq!(percent_decode(&encoded).as_deref(), Some(key));
        }
    }

    #[test]
    fn record_admission_rule() {
        let record = FenceRecord::new("k", 4, 6);
        assert!(!record.admits(4));
        assert!(!record.admits(6));
        assert!(record.admits(7));
        let record = FenceRecord::new("k", 4, 0);
        assert!(record.admits(4) && record.admits(5) && !record.admits(3));
    }

    #[test]
    fn a_header_parses_back_to_its_record() {
        let record = FenceRecord::new("a key/with %", 7, 3);
        let mut bytes = encode_header(&record, 5).into_bytes();
        bytes.extend_from_slice(b"hello");
        let mut reader = BufReader::new(&bytes[..]);
        let Ok((parsed, len)) = parse_header(&mut reader, bytes.len() as u64) else {
            panic!("the header did not parse");
        };
        assert_eq!((parsed, len), (record, 5));
    }
}
