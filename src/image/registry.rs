//! A blocking client of the OCI distribution API over `ureq`: manifests and blobs of one
//! repository, from the registry's mirrors first and then the registry itself. A 401 is
//! answered once (a bearer token from the challenge's realm, or basic credentials), 429 and
//! 5xx and broken connections are retried on the one bounded schedule, honouring
//! `Retry-After`; every body read is bounded.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ureq::http::Response;
use ureq::{Agent, Body};

use super::auth::{parse_challenge, Challenge, CredentialStore};
use super::error::ImageError;
use super::manifest::MAX_DOCUMENT;
use super::settings::RegistryConfig;
use crate::backoff::Backoff;
use crate::cancel::CancelToken;

/// The longest `Retry-After` honoured; a server asking for more gets this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A manifest, config or token exchange, whole.
const DOCUMENT_TIMEOUT: Duration = Duration::from_secs(120);
/// A layer's body; the bytes are counted and checked, so this only bounds a stalled server.
const BLOB_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Redirects a blob GET may take (registries send blobs to storage by 307).
const MAX_REDIRECTS: u32 = 5;

/// How often and how long to retry; the test suite shortens it.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub retries: u32,
    pub base: Duration,
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 5,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        }
    }
}

/// One client, shared by the threads of a run: its tokens serve them all.
pub struct RegistryClient {
    agent: Agent,
    config: RegistryConfig,
    credentials: CredentialStore,
    /// `Authorization` values by `host/repository`, as the last challenge was answered.
    authorizations: Mutex<HashMap<String, String>>,
    retry: RetryPolicy,
    cancel: CancelToken,
}

/// Where a repository is read from: a mirror or the registry.
#[derive(Debug, Clone)]
struct Endpoint {
    host: String,
    /// The registry itself gets the whole retry schedule; a mirror one try before falling back.
    is_mirror: bool,
}

impl RegistryClient {
    /// A client with the Docker config's credentials (`config.docker_config`, else Docker's
    /// own places).
    pub fn new(config: RegistryConfig, cancel: CancelToken) -> Result<RegistryClient, ImageError> {
        let credentials = match config
            .docker_config
            .clone()
            .or_else(CredentialStore::default_path)
        {
            Some(path) => CredentialStore::load(&path)?,
            None => CredentialStore::default(),
        };
        let agent = Agent::config_builder()
            // Statuses are classified here, with the headers in hand.
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_response(Some(DOCUMENT_TIMEOUT))
            .max_redirects(MAX_REDIRECTS)
            // A token for this registry goes to no other host (a blob's storage URL is signed).
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .user_agent(concat!("wmo-e2b/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Ok(RegistryClient {
            agent,
            config,
            credentials,
            authorizations: Mutex::new(HashMap::new()),
            retry: RetryPolicy::default(),
            cancel,
        })
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> RegistryClient {
        self.retry = retry;
        self
    }

    fn endpoints(&self, registry: &str, api_host: &str) -> Vec<Endpoint> {
        let mirrors = self.config.mirrors(registry).iter().map(|m| Endpoint {
            host: m.clone(),
            is_mirror: true,
        });
        mirrors
            .chain(std::iter::once(Endpoint {
                host: api_host.to_string(),
                is_mirror: false,
            }))
            .collect()
    }

    /// A manifest's bytes and content type, by tag or digest.
    pub fn manifest(
        &self,
        registry: &str,
        api_host: &str,
        repository: &str,
        key: &str,
        accept: &str,
    ) -> Result<(Vec<u8>, Option<String>), ImageError> {
        let path = format!("manifests/{key}");
        let mut response = self.get(
            registry,
            api_host,
            repository,
            &path,
            Some(accept),
            DOCUMENT_TIMEOUT,
        )?;
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let what = format!("{registry}/{repository} manifest {key}");
        let bytes = read_document(&what, response.body_mut())?;
        Ok((bytes, content_type))
    }

    /// A blob's body, to be read by the caller (the store checks it as it streams).
    pub fn blob(
        &self,
        registry: &str,
        api_host: &str,
        repository: &str,
        digest: &str,
    ) -> Result<impl std::io::Read, ImageError> {
        let path = format!("blobs/{digest}");
        let response = self.get(registry, api_host, repository, &path, None, BLOB_TIMEOUT)?;
        Ok(response.into_body().into_reader())
    }

    /// GET `/v2/<repository>/<path>` from the mirrors, then the registry: the first success,
    /// else the registry's failure.
    fn get(
        &self,
        registry: &str,
        api_host: &str,
        repository: &str,
        path: &str,
        accept: Option<&str>,
        body_timeout: Duration,
    ) -> Result<Response<Body>, ImageError> {
        let mut last = None;
        for endpoint in self.endpoints(registry, api_host) {
            match self.get_from(&endpoint, repository, path, accept, body_timeout) {
                Ok(r) => return Ok(r),
                Err(ImageError::Cancelled) => return Err(ImageError::Cancelled),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(ImageError::Cancelled))
    }

    fn get_from(
        &self,
        endpoint: &Endpoint,
        repository: &str,
        path: &str,
        accept: Option<&str>,
        body_timeout: Duration,
    ) -> Result<Response<Body>, ImageError> {
        let host = &endpoint.host;
        let url = format!(
            "{}://{host}/v2/{repository}/{path}",
            self.config.scheme(host)
        );
        let key = format!("{host}/{repository}");
        let mut answered_challenge = false;
        let retries = if endpoint.is_mirror {
            0
        } else {
            self.retry.retries
        };
        loop {
            let authorization = crate::sync::lock(&self.authorizations).get(&key).cloned();
            let response = self.exchange(&url, retries, || {
                let mut request = self
                    .agent
                    .get(&url)
                    .config()
                    .timeout_recv_body(Some(body_timeout))
                    .build();
                if let Some(accept) = accept {
                    request = request.header("Accept", accept);
                }
                if let Some(a) = &authorization {
                    request = request.header("Authorization", a);
                }
                request.call()
            })?;
            match response.status().as_u16() {
                200..=299 => return Ok(response),
                401 if !answered_challenge => {
                    answered_challenge = true;
                    let header = response
                        .headers()
                        .get("www-authenticate")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    let authorization = self.answer(host, repository, header)?;
                    crate::sync::lock(&self.authorizations).insert(key.clone(), authorization);
                }
                401 | 403 => {
                    return Err(ImageError::Unauthorized {
                        registry: host.clone(),
                        why: format!("{url} answered {}", response.status().as_u16()),
                    })
                }
                404 => return Err(ImageError::NotFound { url }),
                status => return Err(ImageError::Status { url, status }),
            }
        }
    }

    /// The `Authorization` that answers a challenge: a token from a bearer challenge's realm
    /// (with the Docker config's credentials for `host` when it has them), or basic
    /// credentials.
    fn answer(&self, host: &str, repository: &str, header: &str) -> Result<String, ImageError> {
        let credentials = self.credentials.for_host(host);
        let unauthorized = |why: &str| ImageError::Unauthorized {
            registry: host.to_string(),
            why: why.to_string(),
        };
        match parse_challenge(header) {
            None => Err(unauthorized(
                "it answered 401 with no Bearer or Basic challenge",
            )),
            Some(Challenge::Basic) => credentials.map(|c| c.basic_header()).ok_or_else(|| {
                unauthorized("it asks for credentials and the Docker config has none for it")
            }),
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                // Whether it may be reached over plain HTTP is decided with every request.
                if url_host(&realm).is_none() {
                    return Err(unauthorized("its token realm is not an http(s) URL"));
                }
                let scope = scope.unwrap_or_else(|| format!("repository:{repository}:pull"));
                let token = self.token(&realm, service.as_deref(), &scope, credentials)?;
                Ok(format!("Bearer {token}"))
            }
        }
    }

    fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        credentials: Option<&super::auth::Credentials>,
    ) -> Result<String, ImageError> {
        let mut response = self.exchange(realm, self.retry.retries, || {
            let mut request = self.agent.get(realm).query("scope", scope);
            if let Some(service) = service {
                request = request.query("service", service);
            }
            if let Some(c) = credentials {
                request = request.header("Authorization", c.basic_header());
            }
            request.call()
        })?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(ImageError::Unauthorized {
                registry: url_host(realm).unwrap_or_default(),
                why: format!("the token service answered {status}"),
            });
        }
        let bytes = read_document("the token answer", response.body_mut())?;
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: TokenAnswer =
            serde_json::from_slice(&bytes).map_err(|_| ImageError::Unauthorized {
                registry: url_host(realm).unwrap_or_default(),
                why: "the token service's answer is not JSON with a token".into(),
            })?;
        answer
            .token
            .or(answer.access_token)
            // The token goes into a header: printable ASCII only.
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| ImageError::Unauthorized {
                registry: url_host(realm).unwrap_or_default(),
                why: "the token service's answer holds no usable token".into(),
            })
    }

    /// One exchange, retried on 429, 5xx and broken connections up to `retries` times;
    /// any other answer is returned as it came.
    fn exchange(
        &self,
        url: &str,
        retries: u32,
        attempt: impl Fn() -> Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>, ImageError> {
        if url.starts_with("http://")
            && !url_host(url).is_some_and(|h| self.config.plain_http_allowed(&h))
        {
            return Err(ImageError::PlainHttpRefused {
                url: url.to_string(),
            });
        }
        let mut backoff = Backoff::doubling(self.retry.base, self.retry.cap, retries);
        loop {
            if self.cancel.is_cancelled() {
                return Err(ImageError::Cancelled);
            }
            let (error, asked_wait) = match attempt() {
                Ok(r) if r.status().as_u16() == 429 || r.status().is_server_error() => (
                    ImageError::Status {
                        url: url.to_string(),
                        status: r.status().as_u16(),
                    },
                    retry_after(&r),
                ),
                Ok(r) => return Ok(r),
                Err(e) if is_transient(&e) => (
                    ImageError::Transport {
                        url: url.to_string(),
                        source: Box::new(e),
                    },
                    None,
                ),
                Err(e) => {
                    return Err(ImageError::Transport {
                        url: url.to_string(),
                        source: Box::new(e),
                    })
                }
            };
            let Some(delay) = backoff.next() else {
                return Err(if retries == 0 {
                    error
                } else {
                    ImageError::RetriesExhausted {
                        url: url.to_string(),
                        attempts: backoff.taken() + 1,
                        last: Box::new(error),
                    }
                });
            };
            if !self.cancel.sleep(asked_wait.unwrap_or(delay)) {
                return Err(ImageError::Cancelled);
            }
        }
    }
}

/// A manifest, config or token body, at most [`MAX_DOCUMENT`] bytes.
pub(super) fn read_document(what: &str, body: &mut Body) -> Result<Vec<u8>, ImageError> {
    body.with_config()
        .limit(MAX_DOCUMENT)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => ImageError::TooLarge {
                what: what.to_string(),
                max: MAX_DOCUMENT,
            },
            e => ImageError::Transport {
                url: what.to_string(),
                source: Box::new(e),
            },
        })
}

/// The `host[:port]` of an http(s) URL.
fn url_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    // Credentials in a URL's authority are never ours to send.
    (!authority.is_empty() && !authority.contains('@')).then(|| authority.to_string())
}

/// Delta-seconds `Retry-After`, capped at [`MAX_RETRY_AFTER`].
fn retry_after(response: &Response<Body>) -> Option<Duration> {
    let value = response.headers().get("retry-after")?.to_str().ok()?;
    let secs: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

fn is_transient(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Protocol(_)
            | ureq::Error::BodyStalled
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_hosts_refuse_userinfo() {
        assert_eq!(
            url_host("https://auth.io:8443/token?x=1").as_deref(),
            Some("auth.io:8443")
        );
        assert_eq!(url_host("http://u:p@127.0.0.1/t"), None);
        assert_eq!(url_host("ftp://x/t"), None);
    }
}
