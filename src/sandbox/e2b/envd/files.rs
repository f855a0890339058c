//! envd's `/files`: whole-file reads (repeated as the server allows) and writes, each bounded
//! by idleness rather than in total, so a gigabyte moves as long as bytes keep moving.

use ureq::RequestBuilder;

use super::version::OCTET_STREAM_UPLOADS;
use super::{Envd, MAX_UNARY_BODY};
use crate::sandbox::e2b::error::{CallFailure, EnvdFailure, Limits};
use crate::sandbox::ErrorClass;

/// Largest file `read_file` returns (the same bound as the local backend).
pub const MAX_FILE_BYTES: u64 = 1 << 30;
/// Multipart boundary for uploads to envd older than 0.5.7. A multipart part ends at the first
/// boundary, so data that contains it is refused rather than cut.
const BOUNDARY: &str = "wmo-e2b-upload-7f3c9a1d5b";

impl Envd {
    /// A transfer's limits: connecting as usual, then no total, only silence.
    fn transfer_limits(&self) -> Limits {
        Limits {
            total: None,
            connect: self.link.connect_timeout,
            silence: Some(self.link.transfer_idle),
        }
    }

    /// `GET /files?path=&username=`: the whole file, read as `user`.
    pub fn read_file(&self, path: &str, user: &str) -> Result<Vec<u8>, EnvdFailure> {
        let limits = self.transfer_limits();
        let read = self.exchange(&limits, MAX_FILE_BYTES, true, || {
            let req = self
                .headers(self.link.agent.get(self.url("/files")))
                .query("path", path)
                .query("username", user);
            idle_bounded(req, &limits).call()
        });
        read.map_err(|f| match f {
            EnvdFailure::Call(CallFailure {
                source: Some(source),
                ..
            }) if matches!(
                source.downcast_ref::<ureq::Error>(),
                Some(ureq::Error::BodyExceedsLimit(_))
            ) =>
            {
                EnvdFailure::Call(CallFailure::new(
                    ErrorClass::BadRequest,
                    format!("{path} is larger than {MAX_FILE_BYTES} bytes"),
                    Some(source),
                ))
            }
            other => other,
        })
    }

    /// `POST /files?path=&username=`: creates or replaces the file as `user` (who then owns
    /// it); envd creates its parents. Sent once.
    pub fn write_file(&self, path: &str, data: &[u8], user: &str) -> Result<(), EnvdFailure> {
        let limits = self.transfer_limits();
        let multipart_body = if self.supports(OCTET_STREAM_UPLOADS) {
            None
        } else {
            Some(multipart(path, data)?)
        };
        self.exchange(&limits, MAX_UNARY_BODY, false, || {
            let req = self
                .headers(self.link.agent.post(self.url("/files")))
                .query("path", path)
                .query("username", user);
            match &multipart_body {
                Some(body) => {
                    let kind = format!("multipart/form-data; boundary={BOUNDARY}");
                    idle_bounded(req.header("Content-Type", kind), &limits).send(&body[..])
                }
                None => {
                    let req = req.header("Content-Type", "application/octet-stream");
                    idle_bounded(req, &limits).send(data)
                }
            }
        })
        .map(drop)
    }
}

/// `req` bounded by `limits`' silence alone: no total, each read and write at most that long.
fn idle_bounded<B>(req: RequestBuilder<B>, limits: &Limits) -> RequestBuilder<B> {
    req.config()
        .timeout_global(None)
        .timeout_per_read(limits.silence)
        .timeout_per_write(limits.silence)
        .build()
}

/// One `file` part whose filename is the full target path, as the SDK sends it.
fn multipart(path: &str, data: &[u8]) -> Result<Vec<u8>, EnvdFailure> {
    let marker = format!("--{BOUNDARY}");
    if memchr::memmem::find(data, marker.as_bytes()).is_some() {
        return Err(EnvdFailure::Call(CallFailure::new(
            ErrorClass::Unsupported,
            "the file contains the multipart boundary this old envd needs",
            None,
        )));
    }
    let name = path.replace('"', "%22");
    let mut body = format!(
        "{marker}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n{marker}--\r\n").as_bytes());
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_bodies_carry_the_path_as_filename() {
        let body = multipart("/home/user/a\"b.txt", b"data").unwrap();
        let text = String::from_utf8(body).unwrap();
        assert!(text.contains("name=\"file\"; filename=\"/home/user/a%22b.txt\""));
        assert!(text.contains("\r\n\r\ndata\r\n--wmo-e2b-upload-7f3c9a1d5b--\r\n"));
        assert!(multipart("/p", format!("x--{BOUNDARY}").as_bytes()).is_err());
    }
}
