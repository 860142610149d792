//! The bucket's retry against object_store's own S3 client and a server of canned answers:
//! the errors the client really returns for 503 SlowDown, 500, 429, a dropped connection and
//! a body cut short are retried; 403 is refused credentials, 404 an answer. (object_store
//! keeps the status of a failed response in a type it does not export: this is where its
//! text is checked.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, RetryConfig};

use super::retry::Retry;
use super::tests::url;
use super::*;
use crate::error::TrainError;

/// One answer to one request (one connection: every answer closes it).
#[derive(Clone, Copy)]
enum Answer {
    /// An S3 error document with this status and code.
    Error(u16, &'static str),
    /// 200 with the whole body.
    Body(&'static [u8]),
    /// 200 announcing `.1` bytes, sending `.0`, then closing the connection.
    Cut(&'static [u8], usize),
    /// The connection closed without an answer.
    Drop,
}

/// A server that answers the requests it gets with `answers`, in order; the requests it
/// answered.
fn serve(answers: Vec<Answer>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for answer in answers {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            count.fetch_add(1, Ordering::SeqCst);
            let _ = conn.write_all(&bytes_of(answer));
        }
    });
    (addr, served)
}

fn bytes_of(answer: Answer) -> Vec<u8> {
    let head = |status: &str, length: usize, kind: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {length}\r\nContent-Type: {kind}\r\n\
             ETag: \"e1\"\r\nLast-Modified: Tue, 15 Nov 1994 08:12:31 GMT\r\n\
             Connection: close\r\n\r\n"
        )
        .into_bytes()
    };
    match answer {
        Answer::Error(code, s3) => {
            let reason = match code {
                403 => "Forbidden",
                404 => "Not Found",
                429 => "Too Many Requests",
                500 => "Internal Server Error",
                _ => "Service Unavailable",
            };
            let body = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{s3}</Code>\
                 <Message>{s3}</Message></Error>"
            );
            let mut out = head(&format!("{code} {reason}"), body.len(), "application/xml");
            out.extend_from_slice(body.as_bytes());
            out
        }
        Answer::Body(body) => [head("200 OK", body.len(), "text/plain"), body.to_vec()].concat(),
        Answer::Cut(sent, announced) => {
            [head("200 OK", announced, "text/plain"), sent.to_vec()].concat()
        }
        Answer::Drop => Vec::new(),
    }
}

/// The job's bucket on the server at `addr` through object_store's S3 client, its own retries
/// off (so that each answer reaches the bucket's).
fn s3_bucket(addr: SocketAddr) -> Bucket {
    // As `Bucket::connect` does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let s3 = AmazonS3Builder::new()
        .with_bucket_name("ckpt")
        .with_endpoint(format!("http://{addr}"))
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_region("us-east-1")
        .with_access_key_id("key")
        .with_secret_access_key("secret")
        .with_retry(RetryConfig {
            max_retries: 0,
            retry_timeout: Duration::from_secs(5),
            backoff: BackoffConfig::default(),
        })
        .build()
        .unwrap();
    let mut b = Bucket::with_store(Arc::new(s3), &url(), "job", Some("s3-creds".into())).unwrap();
    b.retry = Retry {
        first: Duration::from_millis(1),
        longest: Duration::from_millis(2),
        within: Duration::from_secs(20),
        tries: 6,
    };
    b
}

#[test]
fn the_s3_clients_transient_errors_are_retried_until_the_body_is_whole() {
    let (addr, served) = serve(vec![
        Answer::Error(503, "SlowDown"),
        Answer::Error(500, "InternalError"),
        Answer::Error(429, "TooManyRequests"),
        Answer::Drop,
        Answer::Cut(b"0123", 10),
        Answer::Body(b"0123456789"),
    ]);
    let b = s3_bucket(addr);
    let (bytes, _) = b.get(&b.object("fence.json")).unwrap().expect("found");
    assert_eq!(bytes.as_ref(), b"0123456789");
    assert_eq!(served.load(Ordering::SeqCst), 6);
}

#[test]
fn the_s3_clients_slowdown_past_the_bound_fails_and_is_retried_by_the_next_start() {
    let (addr, served) = serve(vec![Answer::Error(503, "SlowDown"); 6]);
    let b = s3_bucket(addr);
    let e = b.get(&b.object("fence.json")).unwrap_err();
    assert!(matches!(e, TrainError::Other(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("gave up after 6 tries") && text.contains("SlowDown"),
        "{text}"
    );
    assert_eq!(served.load(Ordering::SeqCst), 6);
}

#[test]
fn the_s3_clients_403_is_refused_credentials_and_404_an_answer() {
    let (addr, served) = serve(vec![
        Answer::Error(403, "AccessDenied"),
        Answer::Error(404, "NoSuchKey"),
    ]);
    let b = s3_bucket(addr);
    let e = b.get(&b.object("fence.json")).unwrap_err();
    assert!(matches!(e, TrainError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("Secret s3-creds"), "{e}");
    assert_eq!(served.load(Ordering::SeqCst), 1, "not retried");
    assert!(b.get(&b.object("fence.json")).unwrap().is_none());
    assert_eq!(served.load(Ordering::SeqCst), 2);
}
