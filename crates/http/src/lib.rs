//! The agents' small HTTP layer (`/healthz`, `/livez`, `/metrics` of the proxy, node routes
//! and DNS agents): a dedicated tokio runtime, and listeners that are bound by the caller
//! and served by the runtime. What each path answers is the agents' business: the proxy's
//! health servers (`weir_proxy::health`) build on [`bind`], [`serve`] and [`respond`]; the
//! other agents use [`PathServer`] and [`MetricsServer`].
//!
//! Sockets belong to the network namespace of the thread that creates them, and tokio's
//! worker threads may sit in another one; so every listener is bound with std on the
//! caller's thread and only then handed to the runtime.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The request and response types a [`Handler`] sees.
pub use hyper::body::Incoming;
pub use hyper::{Request, Response};

/// A response body.
pub type Body = Full<Bytes>;
/// Answers one request (called on the runtime; must not block).
pub type Handler = Arc<dyn Fn(&Request<Incoming>) -> Response<Body> + Send + Sync>;

/// A slow client may not hold a connection open without sending a request.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long closing a listener waits for its accept loop to end.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The runtime serving every health listener: one worker thread, owned here. Cheap to clone.
/// Create and drop it outside any async context (the agent loop is synchronous).
#[derive(Clone)]
pub struct HttpRuntime {
    rt: Arc<Runtime>,
}

impl HttpRuntime {
    pub fn new() -> io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weir-health")
            .enable_io()
            .enable_time()
            .build()?;
        Ok(Self { rt: Arc::new(rt) })
    }

    /// The runtime's handle.
    pub fn handle(&self) -> &Handle {
        self.rt.handle()
    }
}

/// Binds `addr` in the calling thread's network namespace. The error names the address
/// (healthz and metrics each have one; "Address already in use" alone does not say which).
pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// One listener being served. Dropping it closes the listener and its connections; the
/// port is free again when `drop` returns.
pub struct Served {
    addr: SocketAddr,
    stop: Option<watch::Sender<()>>,
    task: Option<JoinHandle<()>>,
    rt: Handle,
}

impl Served {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        drop(self.stop.take()); // every task of this listener sees the channel close
        if let Some(task) = self.task.take() {
            if Handle::try_current().is_ok() {
                task.abort(); // cannot block inside a runtime; the port frees shortly
            } else {
                let _ = self
                    .rt
                    .block_on(async { tokio::time::timeout(CLOSE_TIMEOUT, task).await });
            }
        }
    }
}

/// Serves `listener` (bound by [`bind`]) with `handler` on the runtime.
pub fn serve(
    rt: &HttpRuntime,
    listener: std::net::TcpListener,
    handler: Handler,
) -> io::Result<Served> {
    let addr = listener.local_addr()?;
    let handle = rt.handle().clone();
    let listener = {
        let _ctx = handle.enter(); // from_std registers with this runtime's reactor
        tokio::net::TcpListener::from_std(listener)?
    };
    let (stop, stopped) = watch::channel(());
    let task = handle.spawn(accept_loop(listener, handler, stopped));
    Ok(Served {
        addr,
        stop: Some(stop),
        task: Some(task),
        rt: handle,
    })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    handler: Handler,
    mut stopped: watch::Receiver<()>,
) {
    loop {
        let stream = tokio::select! {
            _ = stopped.changed() => return,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: back off instead of spinning.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let handler = handler.clone();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let resp = handler(&req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stopped.changed() => {}
            }
        });
    }
}

/// A response with a body and the given headers.
pub fn respond(status: u16, headers: &[(&str, String)], body: String) -> Response<Body> {
    let mut b = Response::builder().status(status);
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    b.body(Full::new(Bytes::from(body)))
        .expect("static status and header names are valid")
}

/// What a [`PathServer`] answers for a path: status, content type and body.
pub type PathResponse = (u16, &'static str, String);

/// A listener for agents other than the proxy (node routes' `/metrics`, the DNS server's
/// health and metrics): every request's path goes to `route`; `None` answers 404.
pub struct PathServer {
    served: Served,
}

impl PathServer {
    /// Binds `addr` on the calling thread (so in its network namespace) and serves it on `rt`.
    pub fn start(
        rt: &HttpRuntime,
        addr: SocketAddr,
        route: impl Fn(&str) -> Option<PathResponse> + Send + Sync + 'static,
    ) -> io::Result<Self> {
        let handler: Handler =
            Arc::new(
                move |req: &Request<Incoming>| match route(req.uri().path()) {
                    Some((status, kind, body)) => {
                        respond(status, &[("Content-Type", kind.to_string())], body)
                    }
                    None => respond(404, &[], "404 page not found\n".into()),
                },
            );
        Ok(PathServer {
            served: serve(rt, bind(addr)?, handler)?,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.served.addr()
    }
}

/// A `/metrics` listener for agents other than the proxy (node routes): every GET of
/// `/metrics` answers `body()` in Prometheus' text format, any other path 404.
pub struct MetricsServer {
    server: PathServer,
}

impl MetricsServer {
    /// Binds `addr` on the calling thread (so in its network namespace) and serves it on `rt`.
    pub fn start(
        rt: &HttpRuntime,
        addr: SocketAddr,
        body: impl Fn() -> String + Send + Sync + 'static,
    ) -> io::Result<Self> {
        let kind = "text/plain; version=0.0.4; charset=utf-8";
        let server = PathServer::start(rt, addr, move |path| {
            (path == "/metrics").then(|| (200, kind, body()))
        })?;
        Ok(MetricsServer { server })
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }
}
