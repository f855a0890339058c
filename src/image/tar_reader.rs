//! A bounded reader of tar streams as image layers hold them: POSIX ustar, GNU long names and
//! PAX extended headers. Written here rather than taken from a crate because every size in a
//! layer is an attacker's: an extended header or a long name is read into memory only up to
//! a fixed bound, however large its header says it is.

use std::io::{self, Read};

const BLOCK: usize = 512;
/// The most bytes of one PAX extended header (or a global one) kept in memory.
pub const MAX_PAX_BYTES: u64 = 1 << 20;
/// The most bytes of a path or link target, from any header (PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;

/// What a tar stream failed with.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    #[error("reading the layer: {0}")]
    Io(#[from] io::Error),
    #[error("malformed tar: {0}")]
    Malformed(String),
    #[error("{what} of {size} bytes exceeds the bound of {limit} bytes")]
    TooLong {
        what: &'static str,
        size: u64,
        limit: u64,
    },
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    HardLink,
    Symlink,
    CharDevice,
    BlockDevice,
    Dir,
    Fifo,
}

/// One entry's header, with any PAX or GNU overrides applied.
#[derive(Debug, Clone)]
pub struct Entry {
    pub kind: Kind,
    /// The path as written in the archive: not yet checked.
    pub path: Vec<u8>,
    /// A symlink's target or a hardlink's source, as written.
    pub link: Vec<u8>,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: i64,
    pub size: u64,
}

/// Overrides collected from the PAX and GNU headers before an entry.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<i64>,
}

/// Reads entries one after another; an entry's data is read with [`TarReader::read_data`]
/// before the next entry is asked for (what is left of it is skipped).
pub struct TarReader<R> {
    inner: R,
    /// Data bytes of the current entry not yet read.
    data_left: u64,
    /// Padding after the current entry's data.
    padding: u64,
    ended: bool,
}

impl<R: Read> TarReader<R> {
    pub fn new(inner: R) -> TarReader<R> {
        TarReader {
            inner,
            data_left: 0,
            padding: 0,
            ended: false,
        }
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The next entry, or `None` at the end of the archive.
    pub fn next_entry(&mut self) -> Result<Option<Entry>, TarError> {
        if self.ended {
            return Ok(None);
        }
        let mut pending = Pending::default();
        loop {
            self.skip_rest()?;
            let mut header = [0u8; BLOCK];
            if !self.read_block(&mut header)? {
                // No end-of-archive blocks: tolerated, as GNU tar does.
                self.ended = true;
                return Ok(None);
            }
            if header.iter().all(|&b| b == 0) {
                self.ended = true;
                return Ok(None);
            }
            verify_checksum(&header)?;
            let size = pending.size.take().unwrap_or(number(&header[124..136])?);
            self.data_left = size;
            self.padding = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
            match header[156] {
                b'x' => self.read_pax(&mut pending, size)?,
                b'g' => {
                    // Global headers set defaults this reader has no use for.
                    self.read_small(size, MAX_PAX_BYTES, "a global PAX header")?;
                }
                b'L' => pending.path = Some(self.read_gnu_name(size)?),
                b'K' => pending.link = Some(self.read_gnu_name(size)?),
                flag => return Ok(Some(entry(&header, flag, size, pending)?)),
            }
        }
    }

    /// Reads the current entry's data into `buf`; 0 at its end.
    pub fn read_data(&mut self, buf: &mut [u8]) -> Result<usize, TarError> {
        if self.data_left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.data_left).unwrap_or(usize::MAX));
        let n = read_retrying(&mut self.inner, &mut buf[..want])?;
        if n == 0 {
            return Err(TarError::Malformed(
                "the stream ends inside an entry".into(),
            ));
        }
        self.data_left -= n as u64;
        Ok(n)
    }

    /// Reads whatever follows the end of the archive (blocking padding), so that a digest of
    /// the whole stream can be taken.
    pub fn drain(&mut self) -> Result<(), TarError> {
        let mut buf = [0u8; 1 << 14];
        while read_retrying(&mut self.inner, &mut buf)? > 0 {}
        Ok(())
    }

    fn skip_rest(&mut self) -> Result<(), TarError> {
        let mut left = self.data_left + self.padding;
        let mut buf = [0u8; 1 << 14];
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = read_retrying(&mut self.inner, &mut buf[..want])?;
            if n == 0 {
                return Err(TarError::Malformed(
                    "the stream ends inside an entry".into(),
                ));
            }
            left -= n as u64;
        }
        self.data_left = 0;
        self.padding = 0;
        Ok(())
    }

    /// A whole block, or false at a clean end of stream.
    fn read_block(&mut self, block: &mut [u8; BLOCK]) -> Result<bool, TarError> {
        let mut got = 0;
        while got < BLOCK {
            let n = read_retrying(&mut self.inner, &mut block[got..])?;
            if n == 0 {
                return match got {
                    0 => Ok(false),
                    _ => Err(TarError::Malformed(
                        "the stream ends inside a header".into(),
                    )),
                };
            }
            got += n;
        }
        Ok(true)
    }

    fn read_small(
        &mut self,
        size: u64,
        limit: u64,
        what: &'static str,
    ) -> Result<Vec<u8>, TarError> {
        if size > limit {
            return Err(TarError::TooLong { what, size, limit });
        }
        let mut data = vec![0u8; size as usize];
        let mut got = 0;
        while got < data.len() {
            let n = self.read_data(&mut data[got..])?;
            got += n;
        }
        Ok(data)
    }

    fn read_gnu_name(&mut self, size: u64) -> Result<Vec<u8>, TarError> {
        let data = self.read_small(size, MAX_PATH_BYTES as u64 + 1, "a GNU long name")?;
        Ok(until_nul(&data).to_vec())
    }

    fn read_pax(&mut self, pending: &mut Pending, size: u64) -> Result<(), TarError> {
        let data = self.read_small(size, MAX_PAX_BYTES, "a PAX extended header")?;
        let mut rest = &data[..];
        while !rest.is_empty() {
            let (key, value, after) = pax_record(rest)?;
            rest = after;
            match key {
                b"path" => pending.path = Some(value.to_vec()),
                b"linkpath" => pending.link = Some(value.to_vec()),
                b"size" => pending.size = Some(pax_number(key, value)?),
                b"uid" => pending.uid = Some(pax_number(key, value)?),
                b"gid" => pending.gid = Some(pax_number(key, value)?),
                b"mtime" => pending.mtime = Some(pax_time(value)?),
                // Extended attributes and the rest are not kept in the root filesystem.
                _ => {}
            }
        }
        Ok(())
    }
}

fn read_retrying(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

fn entry(header: &[u8; BLOCK], flag: u8, size: u64, p: Pending) -> Result<Entry, TarError> {
    let kind = match flag {
        b'0' | 0 | b'7' => Kind::File,
        b'1' => Kind::HardLink,
        b'2' => Kind::Symlink,
        b'3' => Kind::CharDevice,
        b'4' => Kind::BlockDevice,
        b'5' => Kind::Dir,
        b'6' => Kind::Fifo,
        other => {
            return Err(TarError::Malformed(format!(
                "unsupported entry type {:?}",
                char::from(other)
            )))
        }
    };
    let path = match p.path {
        Some(path) => path,
        None => header_path(header),
    };
    let link = p
        .link
        .unwrap_or_else(|| until_nul(&header[157..257]).to_vec());
    for (what, bytes) in [("path", &path), ("link target", &link)] {
        if bytes.len() > MAX_PATH_BYTES {
            return Err(TarError::TooLong {
                what,
                size: bytes.len() as u64,
                limit: MAX_PATH_BYTES as u64,
            });
        }
    }
    let mode = u32::try_from(number(&header[100..108])? & 0o7777)
        .map_err(|_| TarError::Malformed("mode".into()))?;
    Ok(Entry {
        kind,
        path,
        link,
        mode,
        uid: p.uid.map_or_else(|| number(&header[108..116]), Ok)?,
        gid: p.gid.map_or_else(|| number(&header[116..124]), Ok)?,
        mtime: p.mtime.map_or_else(
            || number(&header[136..148]).map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            Ok,
        )?,
        size,
    })
}

/// The name field, joined to the prefix field in POSIX ustar headers (GNU headers keep other
/// things there).
fn header_path(header: &[u8; BLOCK]) -> Vec<u8> {
    let name = until_nul(&header[0..100]);
    if &header[257..263] != b"ustar\0" {
        return name.to_vec();
    }
    let prefix = until_nul(&header[345..500]);
    if prefix.is_empty() {
        return name.to_vec();
    }
    let mut path = prefix.to_vec();
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

fn until_nul(bytes: &[u8]) -> &[u8] {
    match memchr::memchr(0, bytes) {
        Some(end) => &bytes[..end],
        None => bytes,
    }
}

fn verify_checksum(header: &[u8; BLOCK]) -> Result<(), TarError> {
    let stored = number(&header[148..156])?;
    let unsigned: u64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(b)
            }
        })
        .sum();
    // Some old writers summed signed bytes.
    let signed: i64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                i64::from(b as i8)
            }
        })
        .sum();
    if stored == unsigned || i64::try_from(stored).is_ok_and(|s| s == signed) {
        Ok(())
    } else {
        Err(TarError::Malformed(
            "a header's checksum does not match".into(),
        ))
    }
}

/// A numeric header field: octal text, or GNU's base-256 when the top bit is set.
fn number(field: &[u8]) -> Result<u64, TarError> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        if field[0] & 0x40 != 0 {
            return Err(TarError::Malformed("a negative number in a header".into()));
        }
        let mut value: u64 = u64::from(field[0] & 0x3f);
        for &b in &field[1..] {
            value = value
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(|| TarError::Malformed("a header number overflows".into()))?;
        }
        return Ok(value);
    }
    let text = until_nul(field);
    let text = text.trim_ascii();
    if text.is_empty() {
        return Ok(0);
    }
    let text = std::str::from_utf8(text)
        .map_err(|_| TarError::Malformed("a header number is not text".into()))?;
    u64::from_str_radix(text, 8)
        .map_err(|_| TarError::Malformed(format!("a header number {text:?} is not octal")))
}

/// A PAX record's key, its value, and what follows the record.
type PaxRecord<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// One `LEN KEY=VALUE\n` record and what follows it.
fn pax_record(data: &[u8]) -> Result<PaxRecord<'_>, TarError> {
    let bad = || TarError::Malformed("a PAX record is malformed".into());
    let space = memchr::memchr(b' ', data).ok_or_else(bad)?;
    let len: usize = std::str::from_utf8(&data[..space])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
        return Err(bad());
    }
    let record = &data[space + 1..len - 1];
    let eq = memchr::memchr(b'=', record).ok_or_else(bad)?;
    Ok((&record[..eq], &record[eq + 1..], &data[len..]))
}

fn pax_number(key: &[u8], value: &[u8]) -> Result<u64, TarError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            TarError::Malformed(format!(
                "PAX {} is not a number",
                String::from_utf8_lossy(key)
            ))
        })
}

/// A PAX time: decimal seconds, maybe negative, maybe with a fraction (dropped).
fn pax_time(value: &[u8]) -> Result<i64, TarError> {
    let whole = value.split(|&b| b == b'.').next().unwrap_or(value);
    std::str::from_utf8(whole)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| TarError::Malformed("PAX mtime is not a number".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_octal_and_base_256() {
        assert_eq!(number(b"0000644\0").unwrap(), 0o644);
        assert_eq!(number(b"  17 \0").unwrap(), 0o17);
        assert_eq!(number(&[0x80, 0, 0, 0, 0, 0, 1, 0]).unwrap(), 256);
        assert!(number(b"9\0").is_err());
        assert!(number(&[0xff; 8]).is_err());
    }

    #[test]
    fn pax_records_split_and_refuse_bad_lengths() {
        let (k, v, rest) = pax_record(b"15 path=a/b/cd\nX").unwrap();
        assert_eq!((k, v, rest), (&b"path"[..], &b"a/b/cd"[..], &b"X"[..]));
        assert!(pax_record(b"99 path=a\n").is_err());
        assert!(pax_record(b"3 a\n").is_err());
    }

    #[test]
    fn an_oversized_extended_header_is_refused_before_it_is_read() {
        let mut header = [0u8; BLOCK];
        header[..4].copy_from_slice(b"pax0");
        header[124..136].copy_from_slice(b"77777777777\0");
        header[156] = b'x';
        header[257..263].copy_from_slice(b"ustar\0");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let mut reader = TarReader::new(&header[..]);
        assert!(matches!(
            reader.next_entry(),
            Err(TarError::TooLong {
                what: "a PAX extended header",
                ..
            })
        ));
    }
}
