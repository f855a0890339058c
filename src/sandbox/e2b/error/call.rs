//! Exchanges that got no usable answer: connecting, I/O, a timeout (named by the deadline
//! that fired), or a request that could not even be formed.

use std::error::Error as StdError;
use std::time::Duration;

use crate::sandbox::ErrorClass;

pub(super) type BoxError = Box<dyn StdError + Send + Sync>;

/// The time limits of one request, so that a timeout can say which one fired.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The whole exchange; `None` for process streams, which live as long as the process.
    pub total: Option<Duration>,
    pub connect: Duration,
    /// The longest a stream or a file transfer may stay silent (envd sends keepalives well
    /// within it).
    pub silence: Option<Duration>,
}

/// A request that got no usable answer.
#[derive(Debug)]
pub struct CallFailure {
    pub class: ErrorClass,
    /// What went wrong in our words, naming the deadline when one fired.
    pub detail: String,
    /// Which ureq timeout fired, if one did.
    pub timeout: Option<ureq::Timeout>,
    /// Whether the request may have reached the server, so that what it asked for may have
    /// happened (false when no connection was made).
    pub maybe_delivered: bool,
    pub source: Option<BoxError>,
}

impl CallFailure {
    pub fn new(class: ErrorClass, detail: impl Into<String>, source: Option<BoxError>) -> Self {
        CallFailure {
            class,
            detail: detail.into(),
            timeout: None,
            maybe_delivered: true,
            source,
        }
    }
}

/// Classifies a failed exchange. Anything on the network is Transport; a request that could
/// not even be formed (bad URL, bad header) is BadRequest.
pub fn call_failure(e: ureq::Error, limits: &Limits) -> CallFailure {
    let (class, detail, timeout) = match &e {
        ureq::Error::Timeout(t) => {
            let detail = match t {
                ureq::Timeout::Global | ureq::Timeout::PerCall => match limits.total {
                    Some(total) => format!("no complete answer within {}", secs(total)),
                    None => "timed out".to_string(),
                },
                ureq::Timeout::Resolve | ureq::Timeout::Connect => {
                    format!("could not connect within {}", secs(limits.connect))
                }
                ureq::Timeout::PerRead => match limits.silence {
                    Some(s) => format!("the server sent nothing for {}", secs(s)),
                    None => "a read timed out".to_string(),
                },
                ureq::Timeout::PerWrite => match limits.silence {
                    Some(s) => format!("the server took nothing for {}", secs(s)),
                    None => "a write timed out".to_string(),
                },
                other => format!("the {other} timeout fired"),
            };
            (ErrorClass::Transport, detail, Some(*t))
        }
        ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::RequireHttpsOnly(_)
        | ureq::Error::InvalidProxyUrl => (
            ErrorClass::BadRequest,
            "the request could not be formed".to_string(),
            None,
        ),
        _ => (
            ErrorClass::Transport,
            "the request failed".to_string(),
            None,
        ),
    };
    // Without a connection nothing reached the server.
    let maybe_delivered = !matches!(
        &e,
        ureq::Error::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
    ) && !matches!(&e, ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused)
        && class == ErrorClass::Transport;
    CallFailure {
        class,
        detail,
        timeout,
        maybe_delivered,
        source: Some(Box::new(e)),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_name_their_deadline() {
        let limits = Limits {
            total: Some(Duration::from_secs(30)),
            connect: Duration::from_secs(10),
            silence: Some(Duration::from_secs(65)),
        };
        let f = call_failure(ureq::Error::Timeout(ureq::Timeout::Global), &limits);
        assert_eq!(f.class, ErrorClass::Transport);
        assert!(f.detail.contains("30.000 s"), "{}", f.detail);
        assert_eq!(f.timeout, Some(ureq::Timeout::Global));
        let f = call_failure(ureq::Error::Timeout(ureq::Timeout::PerRead), &limits);
        assert!(f.detail.contains("nothing for 65.000 s"), "{}", f.detail);
        let f = call_failure(ureq::Error::Timeout(ureq::Timeout::Connect), &limits);
        assert!(f.detail.contains("connect within 10.000 s"), "{}", f.detail);
        let f = call_failure(ureq::Error::Timeout(ureq::Timeout::PerWrite), &limits);
        assert!(f.detail.contains("nothing for 65.000 s"), "{}", f.detail);
        let f = call_failure(ureq::Error::BadUri("x".into()), &limits);
        assert_eq!(f.class, ErrorClass::BadRequest);
        assert!(!f.maybe_delivered);
        let f = call_failure(ureq::Error::ConnectionFailed, &limits);
        assert_eq!(f.class, ErrorClass::Transport);
        assert!(!f.maybe_delivered, "no connection, nothing delivered");
        let f = call_failure(ureq::Error::Timeout(ureq::Timeout::Global), &limits);
        assert!(
            f.maybe_delivered,
            "an answer that came too late may follow the work"
        );
    }
}
