//! A real HTTPS upstream on the host's loopback for the tests of TLS
//! inspection and learn mode: a test CA, certificates for `allowed.test`
//! and `whole.test`, and Python servers that log every request.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use runsbx_testkit::{self as kit, output_via_files};
use serde_json::Value;

/// The HTTPS server: every request logged as a JSON line; `/git/…` is
/// `git http-backend` over the repositories in its root (receive-pack on,
/// so that a push would land if the proxy let it through); `/simple/…`
/// a package index page; anything else `hello METHOD PATH`.
const SERVER: &str = r#"
import http.server, json, os, ssl, subprocess, sys
cert, key, git_root, port_file, log = sys.argv[1:6]

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer(self, status, headers, data):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def handle_any(self):
        data = self.body()
        with open(log, "a") as f:
            f.write(json.dumps({"method": self.command, "path": self.path,
                                "host": self.headers.get("Host", ""),
                                "auth": self.headers.get("Authorization", "")}) + "\n")
        if self.path.startswith("/git/"):
            path, _, query = self.path[len("/git"):].partition("?")
            env = dict(os.environ, GIT_PROJECT_ROOT=git_root, GIT_HTTP_EXPORT_ALL="1",
                       PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command,
                       CONTENT_TYPE=self.headers.get("Content-Type", ""),
                       CONTENT_LENGTH=str(len(data)), REMOTE_USER="tester",
                       REMOTE_ADDR="127.0.0.1")
            out = subprocess.run(["git", "http-backend"], input=data, env=env,
                                 capture_output=True).stdout
            head, _, rest = out.partition(b"\r\n\r\n")
            status, headers = 200, []
            for line in head.split(b"\r\n"):
                name, _, value = line.decode().partition(": ")
                if name.lower() == "status":
                    status = int(value.split()[0])
                elif name:
                    headers.append((name, value))
            self.answer(status, headers, rest)
        elif self.path.startswith("/simple/"):
            page = b'<html><body><a href="/files/tool-1.0.tar.gz">tool-1.0.tar.gz</a></body></html>'
            self.answer(200, [("Content-Type", "text/html")], page)
        else:
            self.answer(200, [("Content-Type", "text/plain")],
                        f"hello {self.command} {self.path}".encode())

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = handle_any

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
"#;

/// A test CA, a certificate for `allowed.test` and one for `whole.test`,
/// the bundle runsbx's proxy trusts (the host's CAs and the test CA), a
/// bare repository, and the HTTPS servers using them.
pub struct Upstream {
    pub dir: tempfile::TempDir,
    servers: Vec<Child>,
    /// `allowed.test`'s server (inspected) and `whole.test`'s (tunnelled).
    pub port: u16,
    pub whole_port: u16,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn sh(cmd: &mut Command) {
    let out = output_via_files(cmd);
    assert_eq!(out.code, 0, "{cmd:?}: {}", out.stderr);
}

impl Upstream {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let openssl = |args: &[&str]| sh(Command::new("openssl").args(args).current_dir(d));
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=runsbx test upstream CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ]);
        for name in ["allowed.test", "whole.test"] {
            openssl(&[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ]);
            std::fs::write(
                d.join(format!("{name}.ext")),
                format!("subjectAltName=DNS:{name}\n"),
            )
            .unwrap();
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                &format!("{name}.ext"),
            ]);
        }
        let mut bundle = std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
        bundle.extend(std::fs::read(d.join("ca.pem")).unwrap());
        std::fs::write(d.join("upstream-trust.pem"), bundle).unwrap();
        // A repository with one commit, served bare.
        let git = |args: &[&str]| sh(Command::new("git").args(args).current_dir(d));
        git(&["init", "-q", "-b", "main", "work"]);
        std::fs::write(d.join("work/README"), "inspected clone\n").unwrap();
        git(&["-C", "work", "add", "README"]);
        git(&[
            "-C",
            "work",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "one",
        ]);
        std::fs::create_dir(d.join("git")).unwrap();
        git(&["clone", "-q", "--bare", "work", "git/repo.git"]);
        git(&["-C", "git/repo.git", "config", "http.receivepack", "true"]);
        // The test user's runsbx reads the trust bundle.
        sh(Command::new("chmod").args(["-R", "a+rX"]).arg(d));
        let mut up = Self {
            dir,
            servers: Vec::new(),
            port: 0,
            whole_port: 0,
        };
        up.port = up.serve("allowed.test");
        up.whole_port = up.serve("whole.test");
        up
    }

    fn serve(&mut self, name: &str) -> u16 {
        let d = self.dir.path();
        let port_file = d.join(format!("{name}.port"));
        let child = Command::new("python3")
            .args(["-c", SERVER])
            .arg(d.join(format!("{name}.pem")))
            .arg(d.join(format!("{name}.key")))
            .arg(d.join("git"))
            .arg(&port_file)
            .arg(d.join("requests.log"))
            .spawn()
            .unwrap();
        self.servers.push(child);
        kit::wait_until(
            "the HTTPS server to listen",
            Duration::from_secs(10),
            || port_file.exists(),
        );
        std::fs::read_to_string(&port_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    pub fn trust(&self) -> PathBuf {
        self.dir.path().join("upstream-trust.pem")
    }

    /// What the servers received, `HOST METHOD PATH AUTHORIZATION` per
    /// request.
    pub fn requests_with_auth(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.path().join("requests.log")).unwrap_or_default();
        log.lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                let s = |k: &str| v[k].as_str().unwrap().to_owned();
                format!("{} {} {} {}", s("host"), s("method"), s("path"), s("auth"))
            })
            .collect()
    }

    /// What the servers received, `METHOD PATH` per request.
    pub fn requests(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.path().join("requests.log")).unwrap_or_default();
        log.lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                format!(
                    "{} {}",
                    v["method"].as_str().unwrap(),
                    v["path"].as_str().unwrap()
                )
            })
            .collect()
    }
}
