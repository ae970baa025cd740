//! A TCP listener whose connections a handler can reset: the handler flips the connection's [`ConnKill`], the
//! next write fails and the socket closes with `SO_LINGER = 0`, so the client gets a TCP reset and no response.

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The loopback listener.
pub(crate) struct SimListener {
    inner: TcpListener,
}

impl SimListener {
    pub(crate) fn new(inner: TcpListener) -> SimListener {
        SimListener { inner }
    }
}

impl Listener for SimListener {
    type Io = SimIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (SimIo, SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (SimIo { inner: stream, kill: ConnKill::default() }, addr);
                }
                // EMFILE and friends: back off briefly, like axum's own listener.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// Per-connection switch, handed to handlers as connect info.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnKill(Arc<AtomicBool>);

impl ConnKill {
    /// The connection will be reset instead of answered.
    pub(crate) fn trigger(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl Connected<IncomingStream<'_, SimListener>> for ConnKill {
    fn connect_info(stream: IncomingStream<'_, SimListener>) -> Self {
        stream.io().kill.clone()
    }
}

/// A TCP stream that fails every write once killed.
pub(crate) struct SimIo {
    inner: TcpStream,
    kill: ConnKill,
}

impl SimIo {
    fn reset(&self) -> io::Error {
        // Linger 0 makes close() send RST and never blocks.
        #[allow(deprecated)]
        let _ = self.inner.set_linger(Some(Duration::ZERO));
        io::Error::new(io::ErrorKind::ConnectionReset, "simulated connection reset")
    }
}

impl AsyncRead for SimIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.kill.is_set() {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.kill.is_set() {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.kill.is_set() {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.kill.is_set() {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.kill.is_set() {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
