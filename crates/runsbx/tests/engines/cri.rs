//! containerd's CRI plugin drives runsbx as a Kubernetes `RuntimeClass`
//! handler, asked through CRI exactly as a kubelet asks: a pod, its
//! containers, exec probes, limits, stop and removal.

use std::collections::HashMap;
use std::fs;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use runsbx_testkit::{self as kit, docker_archive, pause_rootfs, run_ok, skip, Daemon};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{IMAGE, RUNSBX};

const PAUSE: &str = "localhost/runsbx-pause:test";
const HANDLER: &str = "runsbx";
const NS: &str = "k8s.io";

fn socket(d: &Daemon) -> PathBuf {
    d.path().join("containerd.sock")
}

fn start_containerd() -> Daemon {
    let mut d = Daemon::prepare("runsbx-cri-", RUNSBX);
    let p = d.path().to_path_buf();
    let cni_conf = p.join("cni");
    fs::create_dir_all(&cni_conf).unwrap();
    // A bridge network, as a cluster node has; runsbx gives the pod a
    // loopback-only namespace instead of the one CNI sets up.
    fs::write(
        cni_conf.join("10-runsbx-test.conflist"),
        serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "runsbx-test",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": p.join("cni-ipam"),
                        "ranges": [[{ "subnet": "10.88.0.0/16" }]],
                    },
                },
                { "type": "loopback" },
            ],
        })
        .to_string(),
    )
    .unwrap();
    // The shim's --root is this plus containerd's namespace.
    let shim_root = p.join("runsbx-root");
    d.runsbx_root = shim_root.join(NS);
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  # This host lacks CAP_SYS_RESOURCE: no negative oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{HANDLER}]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{HANDLER}.options]
        BinaryName = "{bin}"
        Root = "{runsbx_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = p.join("root").display(),
        state = p.join("state").display(),
        sock = socket(&d).display(),
        opt = p.join("opt").display(),
        bin = d.runsbx.display(),
        runsbx_root = shim_root.display(),
        cni = cni_conf.display(),
    );
    let config_path = p.join("containerd.toml");
    fs::write(&config_path, config).unwrap();
    d.start(
        "containerd",
        &["--config".to_owned(), config_path.display().to_string()],
    );
    d.wait_ready(Duration::from_secs(60), |d| {
        ctr(d)
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    d.on_drop(|d| {
        // What a kubelet would do on the way out: remove every pod.
        let ids = ctr(d)
            .args(["containers", "ls", "-q"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for id in ids.split_whitespace() {
            let _ = ctr(d).args(["tasks", "kill", "-s", "SIGKILL", id]).status();
        }
        std::thread::sleep(Duration::from_millis(300));
        for id in ids.split_whitespace() {
            let _ = ctr(d).args(["tasks", "delete", "-f", id]).status();
            let _ = ctr(d).args(["containers", "delete", id]).status();
        }
    });
    d
}

fn ctr(d: &Daemon) -> Command {
    let mut cmd = Command::new("ctr");
    cmd.arg("--address")
        .arg(socket(d))
        .args(["--namespace", NS])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

async fn client(path: PathBuf) -> RuntimeServiceClient<Channel> {
    let channel = Endpoint::try_from("http://[::]")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .unwrap();
    RuntimeServiceClient::new(channel)
}

fn pod_config(name: &str, logs: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("{name}-uid"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: logs.display().to_string(),
        annotations: HashMap::from([("runsbx.limits.nofile".to_owned(), "512".to_owned())]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: "/runsbx-cri-test".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(name: &str, args: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.into(),
            ..Default::default()
        }),
        command: args.iter().map(|a| (*a).to_owned()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig::default()),
        ..Default::default()
    }
}

/// A TCP listener on the loopback of the daemon's network namespace: the
/// "host loopback" as the pod would see it if it shared the node's network.
fn listen_in(d: &Daemon) -> TcpListener {
    let netns = fs::File::open(format!("/proc/{}/ns/net", d.pid())).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            TcpListener::bind("127.0.0.1:0").unwrap()
        })
        .join()
        .unwrap()
    })
}

#[test]
fn cri_runs_pods_on_runsbx() {
    if !kit::is_root() {
        skip!("cri_runs_pods_on_runsbx: needs root");
    }
    for tool in ["containerd", "ctr", "unshare", "nsenter", "gcc"] {
        if !kit::have(tool) {
            skip!("{tool} is not installed (hack/install-deps.sh)");
        }
    }
    if !Path::new("/usr/lib/cni/bridge").exists() {
        skip!("no CNI plugins (apt-get install containernetworking-plugins)");
    }
    let d = start_containerd();
    for (rootfs, tag, cmd) in [
        (pause_rootfs(d.path()), PAUSE, "/pause"),
        (kit::rootfs().to_owned(), IMAGE, "sh"),
    ] {
        let archive = d.path().join("image.tar");
        docker_archive(&rootfs, tag, &[cmd], &archive);
        run_ok(
            ctr(&d)
                .args(["images", "import", "--snapshotter", "native"])
                .arg(&archive),
        );
    }
    let host_service = listen_in(&d);
    let host_port = host_service.local_addr().unwrap().port();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut cri = client(socket(&d)).await;
        let version = cri
            .version(VersionRequest {
                version: "v1".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(version.runtime_name, "containerd", "{version:?}");

        let logs = d.path().join("pod-logs");
        fs::create_dir_all(&logs).unwrap();
        let pod_cfg = pod_config("pod1", &logs);
        let pod = cri
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(pod_cfg.clone()),
                runtime_handler: HANDLER.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", d.log_text()))
            .into_inner()
            .pod_sandbox_id;
        // runsbx ran the pod's sandbox container and hardened it.
        assert!(
            d.runsbx_root
                .join("@bundles")
                .join(&pod)
                .join("hardening.json")
                .exists(),
            "runsbx holds no bundle for the pod sandbox {pod}: {:?}",
            d.runsbx_containers()
        );

        let create = |name: &str, cfg: ContainerConfig| CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                ..cfg
            }),
            sandbox_config: Some(pod_cfg.clone()),
        };

        // A server on the pod's loopback, with limits; its output in the
        // CRI log file.
        let mut server_cfg = container_config(
            "server",
            &[
                "sh",
                "-c",
                "echo server-up; exec nc -ll -p 8080 -e echo pong",
            ],
        );
        server_cfg.linux = Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                memory_limit_in_bytes: 96 * 1024 * 1024,
                cpu_period: 100_000,
                cpu_quota: 50_000,
                ..Default::default()
            }),
            ..Default::default()
        });
        let server = cri
            .create_container(create("server", server_cfg))
            .await
            .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", d.log_text()))
            .into_inner()
            .container_id;
        cri.start_container(StartContainerRequest {
            container_id: server.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", d.log_text()));
        let server_log = logs.join("server.log");
        kit::wait_until(
            "the server's output in its CRI log",
            Duration::from_secs(10),
            || fs::read_to_string(&server_log).is_ok_and(|l| l.contains(" stdout F server-up")),
        );

        // ExecSync, as exec probes use it: output and exit code.
        let exec = cri
            .exec_sync(ExecSyncRequest {
                container_id: server.clone(),
                cmd: vec!["sh".into(), "-c".into(), "echo probed; exit 3".into()],
                timeout: 10,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (
                exec.exit_code,
                String::from_utf8_lossy(&exec.stdout).as_ref()
            ),
            (3, "probed\n"),
            "{exec:?}"
        );

        // ExecSync is held to the sandbox as the container's init is: its
        // user namespace and host uid (never host root), no capabilities,
        // seccomp, only lo.
        let canary = kit::Canary::start();
        let entered_id = cri
            .create_container(create(
                "entered",
                container_config("entered", &["sh", "-c", kit::ENTERED_INIT]),
            ))
            .await
            .unwrap_or_else(|e| panic!("CreateContainer (entered): {e}\n{}", d.log_text()))
            .into_inner()
            .container_id;
        cri.start_container(StartContainerRequest {
            container_id: entered_id.clone(),
        })
        .await
        .unwrap();
        let exec_sync = |cmd: &str| ExecSyncRequest {
            container_id: entered_id.clone(),
            cmd: vec!["sh".into(), "-c".into(), cmd.into()],
            timeout: 10,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while cri
            .exec_sync(exec_sync("cat /tmp/init-map"))
            .await
            .unwrap()
            .into_inner()
            .exit_code
            != 0
        {
            assert!(Instant::now() < deadline, "the init never got ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let exec = cri
            .exec_sync(exec_sync(kit::ENTERED_PROBE))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(exec.exit_code, 0, "{exec:?}");
        kit::assert_entered_output(&String::from_utf8_lossy(&exec.stdout), &canary);
        let mark = kit::unique_mark();
        cri.exec_sync(exec_sync(&format!("sleep {mark} >/dev/null 2>&1 &")))
            .await
            .unwrap();
        let (uid, cgroups) = kit::host_view(kit::pid_of_sleep(&mark));
        let init = container_pid(&mut cri, &entered_id).await;
        assert_eq!((uid, cgroups), kit::host_view(init as i32));
        assert_ne!(uid, 0, "ExecSync runs as host root");
        cri.stop_container(StopContainerRequest {
            container_id: entered_id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();

        // The pod's containers share its loopback; the node's is not
        // there; the hardening holds in the pod.
        let exec = cri
            .exec_sync(ExecSyncRequest {
                container_id: server.clone(),
                cmd: vec![
                    "sh".into(),
                    "-c".into(),
                    format!("probe status; probe lo; probe connect 127.0.0.1 {host_port}; true"),
                ],
                timeout: 10,
            })
            .await
            .unwrap()
            .into_inner();
        let out = String::from_utf8_lossy(&exec.stdout).into_owned();
        for line in [
            "CapEff:\t0000000000000000",
            "NoNewPrivs:\t1",
            "Seccomp:\t2",
            "lo UP",
            "connect ECONNREFUSED",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} missing: {out}");
        }

        let client_id = cri
            .create_container(create(
                "client",
                container_config(
                    "client",
                    &[
                        "sh",
                        "-c",
                        "probe connect 127.0.0.1 8080; echo done; sleep 1000",
                    ],
                ),
            ))
            .await
            .unwrap_or_else(|e| panic!("CreateContainer (second): {e}\n{}", d.log_text()))
            .into_inner()
            .container_id;
        cri.start_container(StartContainerRequest {
            container_id: client_id.clone(),
        })
        .await
        .unwrap();
        let client_log = logs.join("client.log");
        kit::wait_until("the client's output", Duration::from_secs(10), || {
            fs::read_to_string(&client_log).is_ok_and(|l| l.contains("stdout F done"))
        });
        let text = fs::read_to_string(&client_log).unwrap();
        assert!(text.contains(" stdout F connect ok"), "client log: {text}");

        // The server's limits, where this host has the controllers.
        let pid = container_pid(&mut cri, &server).await;
        check_limits(pid);

        // StopContainer: SIGTERM first (sleep as pid 1 ignores it: the
        // runtime escalates after the timeout).
        let t = Instant::now();
        cri.stop_container(StopContainerRequest {
            container_id: client_id.clone(),
            timeout: 2,
        })
        .await
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(20));
        cri.stop_container(StopContainerRequest {
            container_id: server.clone(),
            timeout: 10,
        })
        .await
        .unwrap();

        cri.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
        cri.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    });
    assert_eq!(
        d.runsbx_containers(),
        Vec::<String>::new(),
        "runsbx state left"
    );
    assert_eq!(d.runsbx_bundles(), Vec::<String>::new(), "bundles left");
    assert_eq!(d.runsbx_mounts(), Vec::<String>::new(), "mounts left");
    let strays: Vec<_> = d
        .stray_processes()
        .into_iter()
        .filter(|(_, c)| !c.contains("containerd-shim"))
        .collect();
    assert!(strays.is_empty(), "processes left: {strays:?}");
}

/// The host pid of a container's init, from its verbose CRI status.
async fn container_pid(cri: &mut RuntimeServiceClient<Channel>, id: &str) -> i64 {
    let status = cri
        .container_status(ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value =
        serde_json::from_str(status.info.get("info").map(String::as_str).unwrap_or("{}")).unwrap();
    let pid = info["pid"].as_i64().unwrap_or(0);
    assert!(pid > 0, "no pid in {info}");
    pid
}

/// The container's cgroup v1 memory and cpu limits (96 MiB; 50 ms per
/// 100 ms).
fn check_limits(pid: i64) {
    let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    check_memory_limit(&cgroups);
    check_cpu_limit(&cgroups);
}

/// The cgroup v1 path of `controller` in a process's /proc/PID/cgroup.
fn v1_path(cgroups: &str, controller: &str) -> Option<String> {
    cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _ = parts.next();
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_owned())
    })
}

fn check_memory_limit(cgroups: &str) {
    let Some(p) = v1_path(cgroups, "memory") else {
        skip!("no cgroup v1 memory controller: the pod's memory limit cannot be read");
    };
    let limit =
        fs::read_to_string(format!("/sys/fs/cgroup/memory{p}/memory.limit_in_bytes")).unwrap();
    assert_eq!(limit.trim(), (96 * 1024 * 1024).to_string());
}

fn check_cpu_limit(cgroups: &str) {
    let Some(p) = v1_path(cgroups, "cpu") else {
        skip!("no cgroup v1 cpu controller: the pod's cpu limit cannot be read");
    };
    let dir = ["cpu,cpuacct", "cpu"]
        .iter()
        .map(|c| format!("/sys/fs/cgroup/{c}{p}"))
        .find(|d| Path::new(d).exists())
        .unwrap();
    let quota = fs::read_to_string(format!("{dir}/cpu.cfs_quota_us")).unwrap();
    assert_eq!(quota.trim(), "50000");
}
