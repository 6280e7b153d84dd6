//! The double's HTTPS server and routes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::verify::{spki_key, verify, Seen};
use super::{Backend, Call, State, WorkRequest};

type Reply = (u16, Value, Vec<(&'static str, String)>);

/// Binds, generates a certificate, serves; returns the address and the CA PEM.
pub(super) async fn serve(bind: SocketAddr, state: Arc<Mutex<State>>) -> (SocketAddr, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("self-signed certificate");
    let cert_pem = cert.cert.pem();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = TcpListener::bind(bind).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            let (acceptor, state) = (acceptor.clone(), state.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(req, state).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, cert_pem)
}

fn error(status: u16, code: &str, message: impl Into<String>) -> Reply {
    (
        status,
        json!({"code": code, "message": message.into()}),
        vec![],
    )
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let method = parts.method.as_str().to_owned();
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let segments: Vec<&str> = target
        .split('?')
        .next()
        .unwrap_or("")
        .trim_start_matches('/')
        .split('/')
        .collect();
    let operation = operation(&method, &segments);

    let (status, value, headers) = {
        let mut s = state.lock().unwrap();
        let seen = Seen {
            method: &method,
            target: &target,
            header: &header,
            body: &body,
        };
        let reply = if operation == "ResourcePrincipalSessionToken" {
            session_token(&mut s, &header, &body)
        } else {
            match verify(&seen, &s.cfg.keys, s.cfg.max_clock_skew) {
                Err(why) => error(401, "NotAuthenticated", why),
                Ok(_) => match injected(&mut s, operation) {
                    Some(r) => r,
                    None => route(&mut s, &state, &method, &segments, &header, &body),
                },
            }
        };
        s.calls.push(Call {
            method: method.clone(),
            operation,
            path: target.clone(),
            status: reply.0,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        reply
    };
    let request_id = format!("{:016x}", fastrand::u64(..));
    let mut resp = Response::builder()
        .status(status)
        .header("opc-request-id", request_id);
    for (k, v) in headers {
        resp = resp.header(k, v);
    }
    let body = if status == 204 {
        Bytes::new()
    } else {
        resp = resp.header("content-type", "application/json");
        Bytes::from(value.to_string())
    };
    resp.body(Full::new(body)).unwrap()
}

fn operation(method: &str, seg: &[&str]) -> &'static str {
    match (method, seg) {
        ("GET", ["20170115", "loadBalancers", _]) => "GetLoadBalancer",
        ("GET", ["20170115", "loadBalancers", _, "backendSets", _]) => "GetBackendSet",
        ("GET", ["20170115", "loadBalancers", _, "backendSets", _, "backends"]) => "ListBackends",
        ("POST", ["20170115", "loadBalancers", _, "backendSets", _, "backends"]) => "CreateBackend",
        ("GET", ["20170115", "loadBalancers", _, "backendSets", _, "backends", _]) => "GetBackend",
        ("PUT", ["20170115", "loadBalancers", _, "backendSets", _, "backends", _]) => {
            "UpdateBackend"
        }
        ("DELETE", ["20170115", "loadBalancers", _, "backendSets", _, "backends", _]) => {
            "DeleteBackend"
        }
        ("GET", ["20170115", "loadBalancerWorkRequests", _]) => "GetWorkRequest",
        ("POST", ["resourcePrincipalSessionTokens"]) => "ResourcePrincipalSessionToken",
        _ => "Unknown",
    }
}

fn is_mutation(op: &str) -> bool {
    matches!(op, "UpdateBackend" | "DeleteBackend" | "CreateBackend")
}

/// An injected answer (queue first, then the random rates on mutations).
fn injected(s: &mut State, op: &'static str) -> Option<Reply> {
    if let Some(i) = s
        .injected
        .iter()
        .position(|(o, _, _)| *o == op || *o == "*")
    {
        let (_, status, code) = s.injected.remove(i).unwrap();
        return Some(error(status, code, format!("injected {status} {code}")));
    }
    if !is_mutation(op) {
        return None;
    }
    let f = &s.cfg.faults;
    let r = fastrand::f64();
    if r < f.conflict {
        Some(error(409, "IncorrectState", "injected conflict"))
    } else if r < f.conflict + f.throttle {
        Some(error(429, "TooManyRequests", "injected throttle"))
    } else if r < f.conflict + f.throttle + f.server_error {
        Some(error(503, "ServiceUnavailable", "injected server error"))
    } else {
        None
    }
}

fn route(
    s: &mut State,
    shared: &Arc<Mutex<State>>,
    method: &str,
    seg: &[&str],
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
) -> Reply {
    match (method, seg) {
        ("GET", ["20170115", "loadBalancerWorkRequests", id]) => match s.work_requests.get(*id) {
            Some(wr) => (
                200,
                json!({
                    "id": id, "loadBalancerId": wr.lb, "type": wr.kind,
                    "lifecycleState": wr.state, "message": wr.message, "errorDetails": [],
                }),
                vec![],
            ),
            None => error(404, "NotAuthorizedOrNotFound", "no such work request"),
        },
        (_, ["20170115", "loadBalancers", lb, rest @ ..]) => {
            let lb = lb.to_string();
            let Some(l) = s.lbs.get(&lb) else {
                return error(
                    404,
                    "NotAuthorizedOrNotFound",
                    format!("no load balancer {lb}"),
                );
            };
            let etag = vec![("etag", l.etag.to_string())];
            let set_json = |name: &str, b: &Vec<Backend>| json!({"name": name, "policy": "ROUND_ROBIN", "backends": b});
            match (method, rest) {
                ("GET", []) => {
                    let sets: serde_json::Map<String, Value> = l
                        .sets
                        .iter()
                        .map(|(n, b)| (n.clone(), set_json(n, b)))
                        .collect();
                    (
                        200,
                        json!({"id": lb, "displayName": lb, "lifecycleState": "ACTIVE", "backendSets": sets}),
                        etag,
                    )
                }
                ("GET", ["backendSets", set]) => match l.sets.get(*set) {
                    Some(b) => (200, set_json(set, b), etag),
                    None => error(404, "NotAuthorizedOrNotFound", "no such backend set"),
                },
                ("GET", ["backendSets", set, "backends"]) => match l.sets.get(*set) {
                    Some(b) => (200, json!(b), etag),
                    None => error(404, "NotAuthorizedOrNotFound", "no such backend set"),
                },
                ("GET", ["backendSets", set, "backends", name]) => {
                    match l
                        .sets
                        .get(*set)
                        .and_then(|b| b.iter().find(|b| b.name == *name))
                    {
                        Some(b) => (200, json!(b), etag),
                        None => error(404, "NotAuthorizedOrNotFound", "no such backend"),
                    }
                }
                ("PUT" | "DELETE" | "POST", ["backendSets", set, "backends", ..]) => {
                    let (set, name) = (set.to_string(), rest.get(3).map(|n| n.to_string()));
                    mutate(s, shared, &lb, &set, name, method, header, body)
                }
                _ => error(404, "NotFound", "unknown path"),
            }
        }
        _ => error(404, "NotFound", "unknown path"),
    }
}

/// The change a work request applies when it completes.
enum Change {
    Update(Value),
    Delete,
    Create(Backend),
}

#[allow(clippy::too_many_arguments)]
fn mutate(
    s: &mut State,
    shared: &Arc<Mutex<State>>,
    lb: &str,
    set: &str,
    name: Option<String>,
    method: &str,
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
) -> Reply {
    if method == "PUT" {
        if let Some(hook) = s.before_update.take() {
            hook(s);
        }
    }
    let l = &s.lbs[lb];
    if let Some(m) = header("if-match") {
        if m != l.etag.to_string() {
            return error(
                412,
                "NoEtagMatch",
                format!("If-Match {m} does not match the current ETag {}", l.etag),
            );
        }
    }
    let Some(backends) = l.sets.get(set) else {
        return error(404, "NotAuthorizedOrNotFound", "no such backend set");
    };
    let change = match method {
        "PUT" => {
            let Ok(v) = serde_json::from_slice::<Value>(body) else {
                return error(400, "InvalidParameter", "body is not JSON");
            };
            for field in ["weight", "backup", "drain", "offline"] {
                if v.get(field).is_none() {
                    return error(400, "MissingParameter", format!("{field} is required"));
                }
            }
            Change::Update(v)
        }
        "DELETE" => Change::Delete,
        _ => {
            let v: Value = serde_json::from_slice(body).unwrap_or_default();
            let (Some(ip), Some(port)) = (v["ipAddress"].as_str(), v["port"].as_u64()) else {
                return error(400, "MissingParameter", "ipAddress and port are required");
            };
            if backends.len() >= s.cfg.backend_limit || l.total() >= s.cfg.backend_limit {
                return error(
                    400,
                    "LimitExceeded",
                    format!("at most {} backends", s.cfg.backend_limit),
                );
            }
            Change::Create(Backend::new(ip, port as u16))
        }
    };
    if let Some(n) = &name {
        if !backends.iter().any(|b| &b.name == n) {
            return error(404, "NotAuthorizedOrNotFound", "no such backend");
        }
    }
    if let Some(wr) = &l.busy {
        return error(
            409,
            "IncorrectState",
            format!("load balancer is being modified by work request {wr}"),
        );
    }
    let id = s.id("ocid1.loadbalancerworkrequest.oc1..wr");
    let kind = match &change {
        Change::Update(_) => "UpdateBackend",
        Change::Delete => "DeleteBackend",
        Change::Create(_) => "CreateBackend",
    };
    s.work_requests.insert(
        id.clone(),
        WorkRequest {
            lb: lb.to_owned(),
            kind,
            state: "ACCEPTED",
            message: String::new(),
        },
    );
    let l = s.lbs.get_mut(lb).unwrap();
    l.etag += 1;
    l.busy = Some(id.clone());
    let (accepted, progress) = (s.cfg.accepted_delay, s.cfg.progress_delay);
    let (shared, lb, set, wr) = (shared.clone(), lb.to_owned(), set.to_owned(), id.clone());
    tokio::spawn(async move {
        tokio::time::sleep(accepted).await;
        set_state(&shared, &wr, "IN_PROGRESS");
        tokio::time::sleep(progress).await;
        let mut s = shared.lock().unwrap();
        let injected = s.fail_work_requests > 0;
        let ok = if injected {
            s.fail_work_requests -= 1;
            false
        } else {
            complete(&mut s, &lb, &set, name.as_deref(), change)
        };
        let l = s.lbs.get_mut(&lb).unwrap();
        l.etag += 1;
        l.busy = None;
        let wr = s.work_requests.get_mut(&wr).unwrap();
        wr.state = if ok { "SUCCEEDED" } else { "FAILED" };
        if !ok {
            wr.message = if injected {
                "injected failure".into()
            } else {
                "the backend no longer exists".into()
            };
        }
    });
    (204, Value::Null, vec![("opc-work-request-id", id)])
}

fn set_state(shared: &Arc<Mutex<State>>, wr: &str, state: &'static str) {
    if let Some(w) = shared.lock().unwrap().work_requests.get_mut(wr) {
        w.state = state;
    }
}

/// Applies a finished work request's change; false when it cannot be.
fn complete(s: &mut State, lb: &str, set: &str, name: Option<&str>, change: Change) -> bool {
    match change {
        Change::Update(v) => {
            let Some(b) = s.backend_mut(lb, set, name.unwrap_or("")) else {
                return false;
            };
            b.weight = v["weight"].as_u64().unwrap_or(1) as u32;
            b.backup = v["backup"].as_bool().unwrap_or(false);
            b.drain = v["drain"].as_bool().unwrap_or(false);
            b.offline = v["offline"].as_bool().unwrap_or(false);
            b.max_connections = v["maxConnections"].as_u64().map(|m| m as u32);
            true
        }
        Change::Delete => {
            let Some(backends) = s.lbs.get_mut(lb).and_then(|l| l.sets.get_mut(set)) else {
                return false;
            };
            let before = backends.len();
            backends.retain(|b| Some(b.name.as_str()) != name);
            let removed = backends.len() < before;
            if removed {
                s.membership_changed(lb, set);
            }
            removed
        }
        Change::Create(b) => {
            let Some(backends) = s.lbs.get_mut(lb).and_then(|l| l.sets.get_mut(set)) else {
                return false;
            };
            backends.push(b);
            s.membership_changed(lb, set);
            true
        }
    }
}

/// The OKE proxymux: a service-account token and a pod key in, a session
/// token out; the pod key is accepted under `ST$<token>` from then on.
fn session_token(s: &mut State, header: &dyn Fn(&str) -> Option<String>, body: &[u8]) -> Reply {
    use base64::Engine as _;
    let bearer = header("authorization").unwrap_or_default();
    let token = bearer.strip_prefix("Bearer ").unwrap_or("");
    if !s.cfg.service_account_tokens.iter().any(|t| t == token) {
        return error(
            401,
            "NotAuthenticated",
            "service account token not accepted",
        );
    }
    let v: Value = serde_json::from_slice(body).unwrap_or_default();
    let b64 = base64::engine::general_purpose::STANDARD;
    let Some(key) = v["podKey"]
        .as_str()
        .and_then(|k| b64.decode(k).ok())
        .and_then(|spki| spki_key(&spki))
    else {
        return error(
            400,
            "InvalidParameter",
            "podKey must be a base64 SubjectPublicKeyInfo",
        );
    };
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        + s.cfg.session_lifetime;
    let n = s.id("");
    let jwt = format!(
        "{}.{}.{}",
        url.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
        url.encode(
            json!({"exp": exp.as_secs(), "sub": "ocid1.workload.oc1..double", "jti": n})
                .to_string()
        ),
        url.encode("double-signature"),
    );
    s.cfg.keys.insert(format!("ST${jwt}"), key);
    let answer = b64.encode(json!({"token": format!("ST${jwt}")}).to_string());
    (200, Value::String(answer), vec![])
}
