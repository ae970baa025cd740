//! A small Chrome DevTools Protocol client: starts Debian's headless Chromium with a remote-debugging port, and
//! speaks to one page over a minimal WebSocket (RFC 6455 client frames, masked; text, continuation, ping and
//! close from the browser). Enough to navigate, evaluate, press keys and take screenshots.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where Chromium is: `BW_CHROMIUM`, else Debian's `/usr/bin/chromium`.
pub fn chromium_path() -> String {
    std::env::var("BW_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    ws: TcpStream,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts Chromium headless and attaches to its first page.
    pub async fn start() -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new(chromium_path())
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts (scripts/setup.sh with BW_WITH_CHROMIUM=1)");
        let stderr = child.stderr.take().expect("stderr");
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let port = tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stderr).lines();
            let port = loop {
                let line = lines.next().expect("chromium printed its DevTools address").expect("stderr line");
                if let Some(rest) = line.split("ws://127.0.0.1:").nth(1) {
                    break rest.split('/').next().expect("port").parse::<u16>().expect("port number");
                }
            };
            // Keep draining so Chromium never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            port
        })
        .await
        .expect("reader");
        let list: Value = reqwest::get(format!("http://127.0.0.1:{port}/json/list"))
            .await
            .expect("DevTools list")
            .json()
            .await
            .expect("json");
        let page = list
            .as_array()
            .and_then(|a| a.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let path = page.split_once(&format!("127.0.0.1:{port}")).expect("ws url").1.to_string();
        let mut ws = TcpStream::connect(("127.0.0.1", port)).await.expect("connect DevTools");
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        ws.write_all(request.as_bytes()).await.expect("handshake");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            ws.read_exact(&mut byte).await.expect("handshake answer");
            head.push(byte[0]);
        }
        assert!(String::from_utf8_lossy(&head).starts_with("HTTP/1.1 101"), "websocket upgrade refused");
        Browser { child, _profile: profile, ws, next_id: 0 }
    }

    async fn send_frame(&mut self, opcode: u8, payload: &[u8]) {
        let mut frame = vec![0x80 | opcode];
        let len = payload.len();
        if len < 126 {
            frame.push(0x80 | len as u8);
        } else if len < 65536 {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
        let mask: [u8; 4] = rand::random();
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.ws.write_all(&frame).await.expect("websocket write");
    }

    /// The next whole text message.
    async fn recv(&mut self) -> String {
        let mut message = Vec::new();
        loop {
            let mut h = [0u8; 2];
            self.ws.read_exact(&mut h).await.expect("websocket read");
            let (fin, opcode) = (h[0] & 0x80 != 0, h[0] & 0x0f);
            let mut len = (h[1] & 0x7f) as u64;
            if len == 126 {
                let mut b = [0u8; 2];
                self.ws.read_exact(&mut b).await.expect("len16");
                len = u16::from_be_bytes(b) as u64;
            } else if len == 127 {
                let mut b = [0u8; 8];
                self.ws.read_exact(&mut b).await.expect("len64");
                len = u64::from_be_bytes(b);
            }
            let mut payload = vec![0u8; len as usize];
            self.ws.read_exact(&mut payload).await.expect("payload");
            match opcode {
                0x9 => self.send_frame(0xA, &payload).await,
                0x8 => panic!("the browser closed the DevTools connection"),
                0x1 | 0x0 => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message).expect("utf-8");
                    }
                }
                _ => {}
            }
        }
    }

    /// Sends a command and returns its `result` (events in between are skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let answer = self.try_call(method, params).await;
        assert!(answer.get("error").is_none(), "{method} failed: {}", answer["error"]);
        answer["result"].clone()
    }

    /// Sends a command and returns the whole answer (`result` or `error`).
    async fn try_call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let text = json!({ "id": id, "method": method, "params": params }).to_string();
        self.send_frame(0x1, text.as_bytes()).await;
        loop {
            let answer: Value = serde_json::from_str(&self.recv().await).expect("json");
            if answer["id"].as_u64() == Some(id) {
                return answer;
            }
        }
    }

    /// Evaluates `expression` in the page; its value (promises awaited), or null while a navigation replaces
    /// the document.
    pub async fn eval(&mut self, expression: &str) -> Value {
        let params = json!({ "expression": expression, "returnByValue": true, "awaitPromise": true });
        self.try_call("Runtime.evaluate", params).await["result"]["result"]["value"].clone()
    }

    pub async fn goto(&mut self, url: &str) {
        self.eval("window.__bwOld = true").await;
        self.call("Page.navigate", json!({ "url": url })).await;
        self.wait_loaded().await;
    }

    /// Waits until a new document (not the one marked by [`Browser::click`]) finished loading.
    pub async fn wait_loaded(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if self.eval("document.readyState === 'complete' && !window.__bwOld").await == true {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "page never loaded");
            // Polling a condition, not waiting for time to pass.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's visible text.
    pub async fn text(&mut self) -> String {
        self.eval("document.body ? document.body.innerText : ''").await.as_str().unwrap_or_default().to_string()
    }

    /// Clicks the first element matching `selector` whose text contains `text`, then waits for the next page.
    pub async fn click(&mut self, selector: &str, text: &str) {
        let js = format!(
            "(() => {{ const e = [...document.querySelectorAll({s})].find(e => e.textContent.includes({t})); \
             if (!e) return false; window.__bwOld = true; e.click(); return true; }})()",
            s = json!(selector),
            t = json!(text)
        );
        assert_eq!(self.eval(&js).await, true, "no `{selector}` with text `{text}` on the page");
        // The click submits a form or follows a link: wait for the new document.
        self.wait_loaded().await;
    }

    /// Presses Tab once (a real key event).
    pub async fn tab(&mut self) {
        for kind in ["keyDown", "keyUp"] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({ "type": kind, "key": "Tab", "code": "Tab", "windowsVirtualKeyCode": 9 }),
            )
            .await;
        }
    }

    /// Saves a PNG of the page under `target/console-screenshots/<name>.png`.
    pub async fn screenshot(&mut self, name: &str) -> std::path::PathBuf {
        use base64::Engine as _;
        let r = self.call("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": true })).await;
        let bytes =
            base64::engine::general_purpose::STANDARD.decode(r["data"].as_str().expect("data")).expect("base64");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).expect("screenshot written");
        path
    }
}
