//! An in-process fake Kubernetes API server, good enough for kube-rs's client, watchers and
//! reflectors: LIST and WATCH (with resourceVersions and label selectors), GET, POST, PUT,
//! PATCH (server-side apply, merge and strategic merge treated as JSON merge patch), DELETE,
//! status subresources, and errors injected by method and path. Every request is recorded.
//!
//! It is not a model of Kubernetes' semantics beyond what the operator relies on: there is no
//! admission, no field ownership, no garbage collection and no kubelet. Tests play the kubelet
//! with [`FakeApiServer::update`] and the user with the kube client.

// The error side of the handlers is the HTTP response itself: simplest for a test server.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Method, Request, Response, StatusCode};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
}

#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    collection: String,
    namespace: String,
    kind: &'static str,
    object: Value,
}

#[derive(Clone, Debug)]
struct Injected {
    method: Method,
    needle: String,
    code: u16,
    remaining: Option<u32>,
}

#[derive(Default)]
struct State {
    rv: u64,
    uid: u64,
    /// collection ("api/v1/pods") -> (namespace, name) -> object
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    history: Vec<Change>,
    requests: Vec<Recorded>,
    injected: Vec<Injected>,
    /// API groups discovery (`GET /apis`) lists besides the built-in ones: (group, versions).
    groups: Vec<(String, Vec<String>)>,
}

/// The server; dropping it stops it.
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where a request points.
#[derive(Debug)]
struct Target {
    collection: String,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix_len, rest) = match *parts.first()? {
        "api" => (2, &parts[2.min(parts.len())..]),
        "apis" => (3, &parts[3.min(parts.len())..]),
        _ => return None,
    };
    let prefix = parts.get(..prefix_len)?.join("/");
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        _ => (None, rest),
    };
    let (resource, name, status) = match rest {
        [resource] => (*resource, None, false),
        [resource, name] => (*resource, Some(name.to_string()), false),
        [resource, name, "status"] => (*resource, Some(name.to_string()), true),
        _ => return None,
    };
    Some(Target {
        collection: format!("{prefix}/{resource}"),
        namespace,
        name,
        status,
    })
}

fn kind_of(collection: &str) -> (String, String) {
    let (gv, resource) = collection
        .rsplit_once('/')
        .expect("collection has a resource");
    let api_version = gv
        .strip_prefix("apis/")
        .or_else(|| gv.strip_prefix("api/"))
        .unwrap_or(gv);
    let kind = match resource {
        "pods" => "Pod",
        "nodes" => "Node",
        "services" => "Service",
        "configmaps" => "ConfigMap",
        "secrets" => "Secret",
        "events" => "Event",
        "leases" => "Lease",
        "persistentvolumeclaims" => "PersistentVolumeClaim",
        "distributedtrainings" => "DistributedTraining",
        "podgroups" => "PodGroup",
        "workloads" => "Workload",
        "networkpolicies" => "NetworkPolicy",
        other => panic!("fake API server: unknown resource {other}"),
    };
    (api_version.to_string(), kind.to_string())
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `k=v,k2=v2` and `k` (exists) selectors.
fn labels_match(selector: Option<&str>, object: &Value) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &object["metadata"]["labels"];
    selector.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => labels[k.trim_end_matches('=')].as_str() == Some(v),
        None => !labels[term].is_null(),
    })
}

fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            let map = target.as_object_mut().expect("object");
            for (k, v) in fields {
                if v.is_null() {
                    map.remove(k);
                } else {
                    merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    respond(code, &body)
}

fn respond(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).expect("valid code"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("response")
}

fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .expect("valid")
        .to_string()
}

impl State {
    fn record(&mut self, target: &Target, kind: &'static str, object: Value) {
        self.history.push(Change {
            rv: self.rv,
            collection: target.collection.clone(),
            namespace: target.namespace.clone().unwrap_or_default(),
            kind,
            object,
        });
    }

    fn bump(&mut self, object: &mut Value) {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = self.rv.to_string().into();
    }

    fn key(target: &Target, name: &str) -> (String, String) {
        (
            target.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    }

    fn create(
        &mut self,
        target: &Target,
        mut object: Value,
    ) -> Result<(Value, Change), Response<Body>> {
        let name = object["metadata"]["name"]
            .as_str()
            .map(str::to_string)
            .or_else(|| target.name.clone())
            .ok_or_else(|| status(422, "Invalid", "metadata.name: Required value"))?;
        let key = Self::key(target, &name);
        if self
            .objects
            .get(&target.collection)
            .is_some_and(|c| c.contains_key(&key))
        {
            return Err(status(
                409,
                "AlreadyExists",
                &format!("{} \"{name}\" already exists", target.collection),
            ));
        }
        let (api_version, kind) = kind_of(&target.collection);
        object["apiVersion"] = api_version.into();
        object["kind"] = kind.into();
        self.uid += 1;
        let meta = &mut object["metadata"];
        meta["name"] = name.clone().into();
        if let Some(ns) = &target.namespace {
            meta["namespace"] = ns.clone().into();
        }
        meta["uid"] = format!("uid-{}", self.uid).into();
        meta["creationTimestamp"] = now().into();
        meta["generation"] = 1.into();
        self.bump(&mut object);
        self.objects
            .entry(target.collection.clone())
            .or_default()
            .insert(key, object.clone());
        self.record(target, "ADDED", object.clone());
        Ok((
            object.clone(),
            self.history.last().cloned().expect("recorded"),
        ))
    }

    /// Replaces the stored object by `f(old)`, keeping the server-owned metadata and bumping
    /// the generation when the spec changed.
    fn modify(
        &mut self,
        target: &Target,
        name: &str,
        f: impl FnOnce(&Value) -> Value,
    ) -> Result<(Value, Change), Response<Body>> {
        let key = Self::key(target, name);
        let Some(old) = self
            .objects
            .get(&target.collection)
            .and_then(|c| c.get(&key))
            .cloned()
        else {
            return Err(status(
                404,
                "NotFound",
                &format!("{} \"{name}\" not found", target.collection),
            ));
        };
        let mut new = f(&old);
        for field in [
            "uid",
            "creationTimestamp",
            "name",
            "namespace",
            "generation",
        ] {
            new["metadata"][field] = old["metadata"][field].clone();
        }
        new["apiVersion"] = old["apiVersion"].clone();
        new["kind"] = old["kind"].clone();
        if new.get("spec") != old.get("spec") {
            new["metadata"]["generation"] =
                (old["metadata"]["generation"].as_i64().unwrap_or(1) + 1).into();
        }
        self.bump(&mut new);
        self.objects
            .get_mut(&target.collection)
            .expect("collection")
            .insert(key, new.clone());
        self.record(target, "MODIFIED", new.clone());
        Ok((new.clone(), self.history.last().cloned().expect("recorded")))
    }
}

impl FakeApiServer {
    /// Starts the server on an ephemeral port of 127.0.0.1.
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let (changes, _) = broadcast::channel(4096);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (s, c) = (state.clone(), changes.clone());
        let app = Router::new().fallback(move |req: Request<Body>| {
            let (s, c) = (s.clone(), c.clone());
            async move { handle(s, c, req).await }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeApiServer {
            state,
            changes,
            url,
            task,
        }
    }

    /// A kube client talking to this server.
    pub fn client(&self) -> kube::Client {
        let mut config = kube::Config::new(self.url.parse().expect("url"));
        config.default_namespace = "default".into();
        config.read_timeout = Some(Duration::from_secs(30));
        kube::Client::try_from(config).expect("client")
    }

    /// The next `times` requests (None: every request) whose method is `method` and whose
    /// `path?query` contains `needle` get the status `code`.
    pub fn fail(&self, method: Method, needle: &str, code: u16, times: Option<u32>) {
        self.state.lock().unwrap().injected.push(Injected {
            method,
            needle: needle.into(),
            code,
            remaining: times,
        });
    }

    /// Stops every injected failure.
    /// Discovery lists `group` with `versions` from now on (e.g. scheduling.k8s.io v1alpha2).
    pub fn serve_group(&self, group: &str, versions: &[&str]) {
        let versions = versions.iter().map(|v| v.to_string()).collect();
        self.state
            .lock()
            .unwrap()
            .groups
            .push((group.into(), versions));
    }

    pub fn heal(&self) {
        self.state.lock().unwrap().injected.clear();
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The objects of a collection ("api/v1/pods"), in (namespace, name) order.
    pub fn list(&self, collection: &str) -> Vec<Value> {
        let state = self.state.lock().unwrap();
        state
            .objects
            .get(collection)
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    /// One object.
    pub fn get(&self, collection: &str, namespace: &str, name: &str) -> Option<Value> {
        let state = self.state.lock().unwrap();
        state
            .objects
            .get(collection)?
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Creates an object as a controller of the cluster would (a node, say).
    pub fn insert(&self, collection: &str, namespace: Option<&str>, object: Value) {
        let target = Target {
            collection: collection.into(),
            namespace: namespace.map(str::to_string),
            name: None,
            status: false,
        };
        let mut state = self.state.lock().unwrap();
        let (_, change) = state
            .create(&target, object)
            .unwrap_or_else(|_| panic!("insert into {collection}"));
        let _ = self.changes.send(change);
    }

    /// Changes an object as the kubelet or a user would; watchers see MODIFIED.
    pub fn update(
        &self,
        collection: &str,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) {
        let target = Target {
            collection: collection.into(),
            namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
            name: Some(name.into()),
            status: false,
        };
        let mut state = self.state.lock().unwrap();
        let (_, change) = state
            .modify(&target, name, |old| {
                let mut new = old.clone();
                f(&mut new);
                new
            })
            .unwrap_or_else(|_| panic!("update {collection} {namespace}/{name}"));
        let _ = self.changes.send(change);
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    req: Request<Body>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let content_type = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let bytes = axum::body::to_bytes(body, 16 << 20)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    {
        let mut s = state.lock().unwrap();
        s.requests.push(Recorded {
            method: parts.method.to_string(),
            path: path.clone(),
            query: query.clone(),
            body: body.clone(),
        });
        if let Some(i) = s
            .injected
            .iter()
            .position(|f| f.method == parts.method && format!("{path}?{query}").contains(&f.needle))
        {
            let code = s.injected[i].code;
            match &mut s.injected[i].remaining {
                Some(1) => {
                    s.injected.remove(i);
                }
                Some(n) => *n -= 1,
                None => {}
            }
            let reason = match code {
                403 => "Forbidden",
                404 => "NotFound",
                409 => "Conflict",
                _ => "InternalError",
            };
            return status(
                code,
                reason,
                &format!("injected {code} for {} {path}", parts.method),
            );
        }
    }
    if path.trim_end_matches('/') == "/apis" {
        return respond(200, &discovery(&state.lock().unwrap().groups));
    }
    let Some(target) = parse_target(&path) else {
        return status(
            404,
            "NotFound",
            &format!("fake API server: no route for {path}"),
        );
    };
    let watch = matches!(query_param(&query, "watch").as_deref(), Some("true" | "1"));
    let method = parts.method.clone();
    let result = match (method, target.name.clone()) {
        (Method::GET, None) if watch => return watch_stream(&state, &changes, &target, &query),
        (Method::GET, None) => Ok(list(&state, &target, &query)),
        (Method::GET, Some(name)) => get(&state, &target, &name),
        (Method::POST, None) => {
            let mut s = state.lock().unwrap();
            s.create(&target, body).map(|(o, ch)| {
                let _ = changes.send(ch);
                o
            })
        }
        (Method::PUT, Some(name)) => write(&state, &changes, &target, &name, |old| {
            let mut new = body.clone();
            if target.status {
                new = old.clone();
                new["status"] = body["status"].clone();
            }
            Ok(new)
        }),
        (Method::PATCH, Some(name)) => patch(&state, &changes, &target, &name, &content_type, body),
        (Method::DELETE, Some(name)) => delete(&state, &changes, &target, &name),
        (m, _) => Err(status(
            405,
            "MethodNotAllowed",
            &format!("fake API server: {m} {path}"),
        )),
    };
    match result {
        Ok(object) => respond(200, &object),
        Err(response) => response,
    }
}

/// An APIGroupList of the served extra groups (what `kubectl api-versions` reads).
fn discovery(groups: &[(String, Vec<String>)]) -> Value {
    let groups: Vec<Value> = groups
        .iter()
        .map(|(name, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| serde_json::json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            serde_json::json!({"name": name, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn list(state: &Mutex<State>, target: &Target, query: &str) -> Value {
    let s = state.lock().unwrap();
    let selector = query_param(query, "labelSelector");
    let items: Vec<Value> = s
        .objects
        .get(&target.collection)
        .map(|c| {
            c.iter()
                .filter(|((ns, _), _)| target.namespace.as_deref().is_none_or(|want| want == ns))
                .filter(|(_, o)| labels_match(selector.as_deref(), o))
                .map(|(_, o)| o.clone())
                .collect()
        })
        .unwrap_or_default();
    let (api_version, kind) = kind_of(&target.collection);
    json!({
        "apiVersion": api_version, "kind": format!("{kind}List"),
        "metadata": {"resourceVersion": s.rv.to_string()},
        "items": items,
    })
}

fn get(state: &Mutex<State>, target: &Target, name: &str) -> Result<Value, Response<Body>> {
    let s = state.lock().unwrap();
    s.objects
        .get(&target.collection)
        .and_then(|c| c.get(&State::key(target, name)))
        .cloned()
        .ok_or_else(|| {
            status(
                404,
                "NotFound",
                &format!("{} \"{name}\" not found", target.collection),
            )
        })
}

fn write(
    state: &Mutex<State>,
    changes: &broadcast::Sender<Change>,
    target: &Target,
    name: &str,
    f: impl FnOnce(&Value) -> Result<Value, Response<Body>>,
) -> Result<Value, Response<Body>> {
    let mut s = state.lock().unwrap();
    let key = State::key(target, name);
    let old = s
        .objects
        .get(&target.collection)
        .and_then(|c| c.get(&key))
        .cloned();
    let Some(old) = old else {
        return Err(status(
            404,
            "NotFound",
            &format!("{} \"{name}\" not found", target.collection),
        ));
    };
    let new = f(&old)?;
    let wanted_rv = new["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    if let Some(rv) = wanted_rv
        && Some(rv.as_str()) != old["metadata"]["resourceVersion"].as_str()
    {
        return Err(status(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let (object, change) = s.modify(target, name, |_| new)?;
    let _ = changes.send(change);
    Ok(object)
}

fn patch(
    state: &Mutex<State>,
    changes: &broadcast::Sender<Change>,
    target: &Target,
    name: &str,
    content_type: &str,
    body: Value,
) -> Result<Value, Response<Body>> {
    let apply = content_type.starts_with("application/apply-patch");
    if !apply && !content_type.contains("merge-patch") {
        return Err(status(
            415,
            "UnsupportedMediaType",
            &format!("fake API server: {content_type}"),
        ));
    }
    let exists = get(state, target, name).is_ok();
    if apply && !exists && !target.status {
        let mut s = state.lock().unwrap();
        let (object, change) = s.create(target, body)?;
        let _ = changes.send(change);
        return Ok(object);
    }
    write(state, changes, target, name, |old| {
        let mut new = old.clone();
        match (apply, target.status) {
            // Apply by one manager replaces what it sent before: the whole status, or every
            // field but the status.
            (true, true) => new["status"] = body["status"].clone(),
            (true, false) => {
                let status = old.get("status").cloned();
                new = body.clone();
                new["metadata"] = old["metadata"].clone();
                merge_patch(&mut new["metadata"], &body["metadata"]);
                if let Some(s) = status {
                    new["status"] = s;
                }
            }
            (false, true) => merge_patch(&mut new["status"], &body["status"]),
            (false, false) => {
                let mut patch = body.clone();
                if let Some(p) = patch.as_object_mut() {
                    p.remove("status");
                }
                merge_patch(&mut new, &patch)
            }
        }
        // Patches carry no resourceVersion precondition here.
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        Ok(new)
    })
}

fn delete(
    state: &Mutex<State>,
    changes: &broadcast::Sender<Change>,
    target: &Target,
    name: &str,
) -> Result<Value, Response<Body>> {
    let mut s = state.lock().unwrap();
    let key = State::key(target, name);
    let removed = s
        .objects
        .get_mut(&target.collection)
        .and_then(|c| c.remove(&key));
    let Some(mut object) = removed else {
        return Err(status(
            404,
            "NotFound",
            &format!("{} \"{name}\" not found", target.collection),
        ));
    };
    s.bump(&mut object);
    s.record(target, "DELETED", object.clone());
    let _ = changes.send(s.history.last().cloned().expect("recorded"));
    Ok(object)
}

fn watch_stream(
    state: &Mutex<State>,
    changes: &broadcast::Sender<Change>,
    target: &Target,
    query: &str,
) -> Response<Body> {
    let selector = query_param(query, "labelSelector");
    let since: u64 = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let wanted = {
        let collection = target.collection.clone();
        let namespace = target.namespace.clone();
        move |c: &Change| {
            c.collection == collection
                && namespace.as_deref().is_none_or(|ns| ns == c.namespace)
                && labels_match(selector.as_deref(), &c.object)
        }
    };
    // Replay and subscribe under one lock: no change falls between the two.
    let (replay, receiver) = {
        let s = state.lock().unwrap();
        let replay: Vec<Change> = s
            .history
            .iter()
            .filter(|c| c.rv > since && wanted(c))
            .cloned()
            .collect();
        (replay, changes.subscribe())
    };
    let line = |c: &Change| -> Result<Bytes, std::io::Error> {
        Ok(Bytes::from(format!(
            "{}\n",
            json!({"type": c.kind, "object": c.object})
        )))
    };
    let live = futures::stream::unfold((receiver, wanted), |(mut rx, wanted)| async move {
        loop {
            match rx.recv().await {
                Ok(c) if wanted(&c) => return Some((c, (rx, wanted))),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let stream = futures::stream::iter(replay)
        .chain(live)
        .map(move |c| line(&c));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("response")
}
