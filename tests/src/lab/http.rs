//! HTTP/1.1 to the gateways' admin, metrics and readiness endpoints over
//! keep-alive connections made inside the node's namespace (those
//! listeners are that namespace's 127.0.0.1).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::runtime::Handle;

use super::LabError;

/// One HTTP endpoint inside a namespace, reached over a kept-alive connection
/// (re-dialed when the server closed it).
#[derive(Clone)]
pub struct HttpProbe {
    pub(super) ns: Handle,
    addr: SocketAddr,
    conn: Arc<tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>>,
}

impl HttpProbe {
    /// `ns` is the runtime of a thread inside the namespace of `addr`.
    pub fn new(ns: Handle, addr: SocketAddr) -> HttpProbe {
        HttpProbe {
            ns,
            addr,
            conn: Arc::default(),
        }
    }

    /// `method path` → (status, body), within 5 s.
    pub async fn request(&self, method: &str, path: &str) -> Result<(u16, String), LabError> {
        let probe = self.clone();
        let (m, p) = (method.to_owned(), path.to_owned());
        let what = format!("{method} http://{}{path}", self.addr);
        let task = self.ns.spawn(async move {
            match probe.try_request(&m, &p).await {
                Ok(v) => Ok(v),
                // A kept-alive connection the server closed: once more on a new one.
                Err(_) => probe.try_request(&m, &p).await,
            }
        });
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(LabError::Probe(format!("{what}: {e}"))),
            Ok(Err(e)) => Err(LabError::Probe(format!("{what}: task failed: {e}"))),
            Err(_) => Err(LabError::Timeout(format!("{what} to answer within 5 s"))),
        }
    }

    /// Like [`HttpProbe::request`]; an answer other than 200 is an error.
    pub async fn get_ok(&self, path: &str) -> Result<String, LabError> {
        match self.request("GET", path).await? {
            (200, body) => Ok(body),
            (status, body) => Err(LabError::Probe(format!(
                "GET http://{}{path}: {status}: {body}",
                self.addr
            ))),
        }
    }

    /// Must run on the namespace's runtime (it may dial).
    pub(super) async fn try_request(
        &self,
        method: &str,
        path: &str,
    ) -> Result<(u16, String), String> {
        let mut slot = self.conn.lock().await;
        let reusable = matches!(&*slot, Some(s) if !s.is_closed());
        if !reusable {
            let tcp = tokio::net::TcpStream::connect(self.addr)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(conn);
            *slot = Some(sender);
        }
        let sender = slot.as_mut().expect("set above");
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "lab")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let sent = async {
            sender.ready().await?;
            sender.send_request(req).await
        };
        let resp = match sent.await {
            Ok(r) => r,
            Err(e) => {
                *slot = None;
                return Err(format!("request: {e}"));
            }
        };
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}
