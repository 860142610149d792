//! When checkpoints are saved and which are kept.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// When checkpoints are written and which are kept.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointPolicy {
    /// Save every this many steps (and at the end); 0 = only at the end.
    #[serde(default = "defaults::checkpoint_every_steps")]
    pub every_steps: u64,
    /// Also save when this many seconds passed since the last save.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub every_seconds: Option<u64>,
    /// Keep the newest K complete checkpoints.
    #[serde(default = "defaults::keep_latest")]
    #[schemars(range(min = 1))]
    pub keep_latest: u32,
    /// Also keep the N with the lowest validation loss.
    #[serde(default = "defaults::one")]
    pub keep_best: u32,
    /// Also keep every checkpoint in an S3-compatible bucket: each save is written to the
    /// checkpoint directory as without it, then uploaded off the training thread; a start with
    /// nothing newer on disk resumes from the bucket (docs/checkpoints.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<ObjectStore>,
}

/// An S3-compatible bucket the checkpoints are uploaded to. Credentials come from the
/// standard variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN); in a
/// DistributedTraining from the Secret `spec.checkpoint.storeSecretName`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectStore {
    /// `s3://BUCKET/PREFIX`: a job's checkpoints go to `PREFIX/<job>/step-<step>/`.
    #[schemars(regex(pattern = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"))]
    pub url: String,
    /// An S3-compatible server (MinIO, Ceph RGW, s3s, a cloud's S3 API):
    /// `http(s)://host[:port]`. Leave out for AWS S3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://[^/?#]+/?$"))]
    pub endpoint: Option<String>,
    /// The bucket's region (AWS_REGION's when left out, else us-east-1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub region: Option<String>,
}

/// An `s3://` URL's parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketUrl {
    pub bucket: String,
    /// Without leading or trailing `/`; empty for the bucket's root.
    pub prefix: String,
}

impl BucketUrl {
    /// Parses `s3://BUCKET[/PREFIX]`; the error says what is wrong with it.
    pub fn parse(url: &str) -> Result<BucketUrl, String> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| format!("`{url}` is not an s3:// URL (s3://BUCKET/PREFIX)"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let ok_char =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-';
        if !(3..=63).contains(&bucket.len())
            || !bucket.chars().all(ok_char)
            || bucket.starts_with(['.', '-'])
            || bucket.ends_with(['.', '-'])
        {
            return Err(format!(
                "`{bucket}` is not a bucket name (3-63 of a-z, 0-9, '.', '-', starting and ending with a letter or digit)"
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|part| part == "." || part == "..") || prefix.contains("//") {
            return Err(format!(
                "the prefix `{prefix}` has an empty, `.` or `..` part"
            ));
        }
        Ok(BucketUrl {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

/// Whether `endpoint` is `http(s)://host[:port]` (nothing after it but a `/`).
pub fn check_endpoint(endpoint: &str) -> Result<(), String> {
    Endpoint::parse(endpoint).map(|_| ())
}

/// `HOST[:PORT]` or `[IPV6][:PORT]` split; None for an IPv6 address without brackets, or a
/// bracket not closed or closed before something other than `:PORT`.
fn split_host_port(server: &str) -> Option<(&str, Option<&str>)> {
    let Some(v6) = server.strip_prefix('[') else {
        return match server.rsplit_once(':') {
            // An IPv6 address without its brackets.
            Some((host, _)) if host.contains(':') => None,
            Some((host, port)) => Some((host, Some(port))),
            None => Some((server, None)),
        };
    };
    let (host, after) = v6.split_once(']')?;
    match after {
        "" => Some((host, None)),
        _ => Some((host, Some(after.strip_prefix(':')?))),
    }
}

/// An `endpoint`'s parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    /// A DNS name, or an IP address (IPv6 without its brackets).
    pub host: String,
    /// The port given, else the scheme's: 443 for https, 80 for http.
    pub port: u16,
}

impl Endpoint {
    /// Parses `http(s)://HOST[:PORT][/]`; the error says what is wrong with it.
    pub fn parse(endpoint: &str) -> Result<Endpoint, String> {
        let (https, rest) = match endpoint.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            _ => {
                return Err(format!(
                    "`{endpoint}` is not http://HOST[:PORT] or https://HOST[:PORT]"
                ));
            }
        };
        let server = rest.strip_suffix('/').unwrap_or(rest);
        if server.is_empty() || server.contains(['/', '?', '#', '@']) {
            return Err(format!(
                "`{endpoint}` has a path, query or user part; give the server alone (http(s)://HOST[:PORT])"
            ));
        }
        let (host, port) = split_host_port(server)
            .ok_or_else(|| format!("`{endpoint}`: an IPv6 address is written [ADDRESS]:PORT"))?;
        let port = match port {
            None => Ok(if https { 443 } else { 80 }),
            Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                format!("`{endpoint}`: the port `{p}` is not a number from 1 to 65535")
            }),
        }?;
        if host.is_empty() {
            return Err(format!("`{endpoint}` names no host"));
        }
        Ok(Endpoint {
            https,
            host: host.to_string(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_urls_parse_or_say_what_is_wrong() {
        assert_eq!(
            BucketUrl::parse("s3://ckpt/team-a/runs/").unwrap(),
            BucketUrl {
                bucket: "ckpt".into(),
                prefix: "team-a/runs".into()
            }
        );
        assert_eq!(BucketUrl::parse("s3://ckpt").unwrap().prefix, "");
        for (bad, says) in [
            ("ckpt/x", "not an s3:// URL"),
            ("gs://ckpt", "not an s3:// URL"),
            ("s3://Ckpt", "not a bucket name"),
            ("s3://ab", "not a bucket name"),
            ("s3://-ab", "not a bucket name"),
            ("s3://ckpt/a/../b", "`..`"),
            ("s3://ckpt/a//b", "empty"),
        ] {
            let e = BucketUrl::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn endpoints_are_a_server_alone() {
        for good in [
            "http://s3.store.svc:9000",
            "https://minio.example.com/",
            "http://10.0.0.5",
        ] {
            assert_eq!(check_endpoint(good), Ok(()), "{good}");
        }
        for bad in [
            "s3.example.com",
            "http://",
            "http://h/bucket",
            "https://u@h",
            "ftp://h",
            "http://h:port",
            "http://h:0",
            "http://h:",
            "http://:9000",
            "http://[::1",
            "http://fd00::5",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_endpoint_has_a_host_and_a_port_given_or_of_its_scheme() {
        let parsed = |e: &str| {
            let e = Endpoint::parse(e).unwrap();
            (e.https, e.host, e.port)
        };
        assert_eq!(
            parsed("http://minio.store.svc:9000/"),
            (false, "minio.store.svc".into(), 9000)
        );
        assert_eq!(parsed("http://10.0.0.5"), (false, "10.0.0.5".into(), 80));
        assert_eq!(
            parsed("https://s3.example.com"),
            (true, "s3.example.com".into(), 443)
        );
        assert_eq!(
            parsed("http://[fd00::5]:9000"),
            (false, "fd00::5".into(), 9000)
        );
        assert_eq!(parsed("https://[fd00::5]"), (true, "fd00::5".into(), 443));
    }
}

impl_default_from_serde!(CheckpointPolicy);
