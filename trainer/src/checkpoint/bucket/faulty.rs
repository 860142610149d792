//! An object store that fails as S3 does under load, on a seeded schedule: object_store's
//! in-memory store behind faults of each transient kind (503 SlowDown, 500, 429, a timeout,
//! a reset connection, a body cut part way or ending short, a write done but its answer lost)
//! on each request kind (list, get, head, put, conditional put, multipart create, part and
//! complete, delete). A fault starts a burst on one request of one object: usually a try or
//! two, sometimes longer than the bucket's retry bound.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    Result, UploadPart,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::lock::lock;

/// A request the store serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Request {
    List,
    Get,
    Head,
    Put,
    /// A PUT conditional on an ETag or on absence (the fence).
    PutIf,
    CreateMultipart,
    Part,
    Complete,
    Delete,
}

/// How a request fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fault {
    /// 503 SlowDown: the store throttles.
    SlowDown,
    /// 500 InternalError.
    Internal,
    /// 429.
    TooMany,
    Timeout,
    Reset,
    /// A write the store did, whose answer was lost (a timeout).
    Lost,
    /// A body (of a GET, of a listing) that fails part way.
    BodyCut,
    /// A GET body that ends before its length, without an error.
    BodyShort,
}

impl Fault {
    /// The faults a request can meet.
    fn of(request: Request) -> &'static [Fault] {
        use Fault::*;
        match request {
            Request::Get => &[
                SlowDown, Internal, TooMany, Timeout, Reset, BodyCut, BodyShort,
            ],
            Request::List => &[SlowDown, Internal, TooMany, Timeout, Reset, BodyCut],
            Request::Head | Request::CreateMultipart | Request::Part => {
                &[SlowDown, Internal, TooMany, Timeout, Reset]
            }
            Request::Put | Request::PutIf | Request::Complete | Request::Delete => {
                &[SlowDown, Internal, TooMany, Timeout, Reset, Lost]
            }
        }
    }

    /// The error object_store's S3 client returns for it.
    fn error(self, request: Request, path: &str) -> object_store::Error {
        let status = |code: &str, s3: &str| {
            let text = format!(
                "Error performing {request:?} {path} in 0.1s, after 3 retries, max_retries: 3, \
                 retry_timeout: 30s  - Server returned non-2xx status code: {code}: \
                 <Error><Code>{s3}</Code></Error>"
            );
            Box::new(std::io::Error::other(text)) as Box<dyn std::error::Error + Send + Sync>
        };
        let transport = |kind, io| {
            let e = std::io::Error::new(io, format!("{request:?} {path}"));
            Box::new(HttpError::new(kind, e)) as Box<dyn std::error::Error + Send + Sync>
        };
        use std::io::ErrorKind as Io;
        let source = match self {
            Fault::SlowDown => status("503 Service Unavailable", "SlowDown"),
            Fault::Internal => status("500 Internal Server Error", "InternalError"),
            Fault::TooMany => status("429 Too Many Requests", "TooManyRequests"),
            Fault::Timeout | Fault::Lost => transport(HttpErrorKind::Timeout, Io::TimedOut),
            Fault::Reset => transport(HttpErrorKind::Interrupted, Io::ConnectionReset),
            Fault::BodyCut | Fault::BodyShort => {
                transport(HttpErrorKind::Interrupted, Io::UnexpectedEof)
            }
        };
        object_store::Error::Generic {
            store: "S3",
            source,
        }
    }
}

/// Something another writer does just before a request is served (a takeover, a commit).
pub(super) type OnRequest = Box<dyn FnMut(Request, &str) + Send>;

/// Which requests fail: a fault starts with probability `rate` on a request of an object not
/// failing already, and lasts 1-2 tries, or (one in five) `persistent` tries and more; and
/// the bursts scripted by a test.
pub(super) struct Schedule {
    rng: ChaCha8Rng,
    rate: f64,
    persistent: u32,
    bursts: HashMap<(Request, String), (Fault, u32)>,
    /// Every fault met, in order (printed when a property fails).
    pub(super) log: Vec<String>,
    pub(super) on_request: Option<OnRequest>,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("rate", &self.rate)
            .field("faults", &self.log.len())
            .finish()
    }
}

impl Schedule {
    pub(super) fn new(seed: u64, rate: f64, persistent: u32) -> Schedule {
        Schedule {
            rng: ChaCha8Rng::seed_from_u64(seed),
            rate,
            persistent,
            bursts: HashMap::new(),
            log: Vec::new(),
            on_request: None,
        }
    }

    /// No fault but those scripted.
    pub(super) fn scripted() -> Schedule {
        Schedule::new(0, 0.0, 0)
    }

    /// The next `tries` requests `request` of `path` fail with `fault`.
    pub(super) fn script(&mut self, request: Request, path: &Path, fault: Fault, tries: u32) {
        self.bursts
            .insert((request, path.to_string()), (fault, tries));
    }

    /// No more faults.
    pub(super) fn calm(&mut self) {
        self.bursts.clear();
        self.rate = 0.0;
    }

    fn next(&mut self, request: Request, path: &str) -> Option<Fault> {
        if let Some(action) = &mut self.on_request {
            action(request, path);
        }
        let key = (request, path.to_string());
        let fault = match self.bursts.remove(&key) {
            Some((fault, left)) => {
                if left > 1 {
                    self.bursts.insert(key, (fault, left - 1));
                }
                fault
            }
            None if self.rng.random_bool(self.rate) => {
                let kinds = Fault::of(request);
                let fault = kinds[self.rng.random_range(0..kinds.len())];
                let tries = if self.rng.random_bool(0.2) {
                    self.persistent + self.rng.random_range(0..3)
                } else {
                    self.rng.random_range(1..=2)
                };
                if tries > 1 {
                    self.bursts.insert(key, (fault, tries - 1));
                }
                fault
            }
            None => return None,
        };
        self.log.push(format!("{request:?} {path}: {fault:?}"));
        Some(fault)
    }
}

/// The in-memory store behind a [`Schedule`] of faults.
#[derive(Debug, Clone)]
pub(super) struct Faulty {
    pub(super) inner: Arc<InMemory>,
    pub(super) schedule: Arc<Mutex<Schedule>>,
}

impl fmt::Display for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

impl Faulty {
    pub(super) fn new(inner: Arc<InMemory>, schedule: Schedule) -> Faulty {
        Faulty {
            inner,
            schedule: Arc::new(Mutex::new(schedule)),
        }
    }

    fn fault(&self, request: Request, path: &Path) -> Option<Fault> {
        lock(&self.schedule).next(request, path.as_ref())
    }

    /// A write: failed before it is done, or done with its answer lost.
    async fn write<T>(
        &self,
        request: Request,
        path: &Path,
        done: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match self.fault(request, path) {
            None => done.await,
            Some(Fault::Lost) => {
                done.await?;
                Err(Fault::Lost.error(request, path.as_ref()))
            }
            Some(fault) => Err(fault.error(request, path.as_ref())),
        }
    }

    async fn get(&self, path: &Path, options: GetOptions) -> Result<GetResult> {
        let request = if options.head {
            Request::Head
        } else {
            Request::Get
        };
        let fault = self.fault(request, path);
        match fault {
            None => return self.inner.get_opts(path, options).await,
            Some(Fault::BodyCut | Fault::BodyShort) => {}
            Some(fault) => return Err(fault.error(request, path.as_ref())),
        }
        let got = self.inner.get_opts(path, options).await?;
        let (meta, range, attributes, extensions) = (
            got.meta.clone(),
            got.range.clone(),
            got.attributes.clone(),
            got.extensions.clone(),
        );
        let bytes = got.bytes().await?;
        let mut body = vec![Ok(bytes.slice(..bytes.len() / 2))];
        if fault == Some(Fault::BodyCut) {
            body.push(Err(Fault::BodyCut.error(request, path.as_ref())));
        }
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::iter(body).boxed()),
            meta,
            range,
            attributes,
            extensions,
        })
    }
}

impl ObjectStore for Faulty {
    fn put_opts<'a, 'b, 'c>(
        &'a self,
        location: &'b Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Answer<'c, PutResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        let request = match opts.mode {
            PutMode::Overwrite => Request::Put,
            PutMode::Create | PutMode::Update(_) => Request::PutIf,
        };
        Box::pin(self.write(
            request,
            location,
            self.inner.put_opts(location, payload, opts),
        ))
    }

    fn put_multipart_opts<'a, 'b, 'c>(
        &'a self,
        location: &'b Path,
        opts: PutMultipartOptions,
    ) -> Answer<'c, Box<dyn MultipartUpload>>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            if let Some(fault) = self.fault(Request::CreateMultipart, location) {
                return Err(fault.error(Request::CreateMultipart, location.as_ref()));
            }
            let inner = self.inner.put_multipart_opts(location, opts).await?;
            let upload = FaultyUpload {
                inner,
                store: self.clone(),
                path: location.clone(),
            };
            Ok(Box::new(upload) as Box<dyn MultipartUpload>)
        })
    }

    fn get_opts<'a, 'b, 'c>(
        &'a self,
        location: &'b Path,
        options: GetOptions,
    ) -> Answer<'c, GetResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(self.get(location, options))
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let store = self.clone();
        locations
            .then(move |location| {
                let store = store.clone();
                async move {
                    let location = location?;
                    let done = store.inner.delete(&location);
                    store.write(Request::Delete, &location, done).await?;
                    Ok(location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let path = prefix.cloned().unwrap_or_default();
        let listed = self.inner.list(prefix);
        match self.fault(Request::List, &path) {
            None => listed,
            // A listing whose second page fails.
            Some(Fault::BodyCut) => listed
                .take(2)
                .chain(stream::once(async move {
                    Err(Fault::BodyCut.error(Request::List, path.as_ref()))
                }))
                .boxed(),
            Some(fault) => {
                stream::once(async move { Err(fault.error(Request::List, path.as_ref())) }).boxed()
            }
        }
    }

    fn list_with_delimiter<'a, 'b, 'c>(&'a self, prefix: Option<&'b Path>) -> Answer<'c, ListResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        self.inner.list_with_delimiter(prefix)
    }

    fn copy_opts<'a, 'b, 'c, 'd>(
        &'a self,
        from: &'b Path,
        to: &'c Path,
        options: CopyOptions,
    ) -> Answer<'d, ()>
    where
        'a: 'd,
        'b: 'd,
        'c: 'd,
        Self: 'd,
    {
        self.inner.copy_opts(from, to, options)
    }
}

/// A multipart upload whose parts and completion fail on the store's schedule.
#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    store: Faulty,
    path: Path,
}

impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        match self.store.fault(Request::Part, &self.path) {
            None => self.inner.put_part(data),
            Some(fault) => {
                let e = fault.error(Request::Part, self.path.as_ref());
                Box::pin(async move { Err(e) })
            }
        }
    }

    fn complete<'a, 'b>(&'a mut self) -> Answer<'b, PutResult>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            let store = self.store.clone();
            let path = self.path.clone();
            store
                .write(Request::Complete, &path, self.inner.complete())
                .await
        })
    }

    fn abort<'a, 'b>(&'a mut self) -> Answer<'b, ()>
    where
        'a: 'b,
        Self: 'b,
    {
        self.inner.abort()
    }
}
