"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback, as one object.

    with ControlPlane() as plane:
        core = kubernetes.client.CoreV1Api(plane.api_client())
        ...

Started in dependency order and each waited for: etcd, the API server (RBAC on, serving with a
PKI made at start), then the objects the shipped manifests grant (namespace, service accounts,
roles and bindings, ConfigMaps: `kubectl kustomize manifests/`, everything but workloads, which
would need kubelets), then kube-controller-manager with every controller, then the schedulers:
`default-scheduler` and, from the KubeSchedulerConfiguration the manifests ship, the
power-aware scheduler as its own ServiceAccount, its extender URL pointed at `extender_url`.
Nothing binds outside 127.0.0.1; each process logs into the run directory, and a process that
fails to start raises `ControlPlaneError` with the tail of its log.

What differs from a cluster, on purpose (../shared/k8s/README.md has the facts): no kubelets
(`NodeAgent` stands in), `--endpoint-reconciler-type=none` (a loopback address is invalid in
the `kubernetes` Endpoints), every controller runs as the admin identity, and the node lifecycle
controller's grace period is `node_monitor_grace_s` (kubelets' default is 50 s; tests use less
so that a node that lost its power turns NotReady within seconds, not a minute).
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import yaml

from envtest.assets import REPO, Assets, find_assets
from envtest.pki import Pki, make_pki
from envtest.ports import free_port

SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's address: the first of SERVICE_CIDR
NAMESPACE = "power-aware-scheduler"  # where the manifests put every component
SCHEDULER_CONFIG_MAP = (NAMESPACE, "power-aware-scheduler-config")
# Kinds applied from the manifests at start: what grants identities and rights, and the
# configuration the workloads would read. Workloads (Deployments, CronJobs) are left out: with no
# kubelet their pods would never run, and the tests start the processes themselves.
BOOTSTRAP_KINDS = frozenset(
    {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "PriorityClass",
    }
)


class ControlPlaneError(RuntimeError):
    """A component did not start (or stop) as expected; the message carries its log's tail."""


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Component:
    """One control-plane process: its command line, its log, and how to tell it is ready."""

    name: str
    argv: list[str]
    log: Path
    ready: Callable[[], bool]
    port: int | None = None  # its secure (https) port, where it has one: /healthz, /metrics
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, timeout_s: float = 60.0) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal goes to pytest, which stops us
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ControlPlaneError(
                    f"{self.name} exited with {self.process.returncode} while starting; "
                    f"last lines of {self.log}:\n{_tail(self.log)}"
                )
            if self.ready():
                return
            time.sleep(0.2)
        self.stop()
        raise ControlPlaneError(
            f"{self.name} was not ready within {timeout_s:.0f} s; last lines of {self.log}:\n"
            f"{_tail(self.log)}"
        )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        if not self.running:
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _https_ok(url: str, context: ssl.SSLContext, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _self_signed_tls() -> ssl.SSLContext:
    """For a component's own port: each serves a self-signed certificate it made at start."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def write_kubeconfig(
    path: Path,
    server: str,
    ca_cert: Path,
    *,
    user: str,
    token: str | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
) -> Path:
    credentials: dict[str, str] = {}
    if token is not None:
        credentials["token"] = token
    if client_cert is not None and client_key is not None:
        credentials["client-certificate"] = str(client_cert)
        credentials["client-key"] = str(client_key)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "envtest",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "envtest", "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class ControlPlane:
    """A real control plane on loopback; see the module docstring."""

    def __init__(
        self,
        run_dir: Path | None = None,
        *,
        manifests_dir: Path = REPO / "manifests",
        extender_url: str | None = None,
        node_monitor_grace_s: int = 20,
        scheduler_verbosity: int = 2,
        default_scheduler: bool = True,
        power_aware_scheduler: bool = True,
        controllers: str = "*",
        assets: Assets | None = None,
    ) -> None:
        self.assets = assets or find_assets()
        self._own_run_dir = run_dir is None
        # etcd's data on tmpfs: fsync costs nothing there, and a test session writes a lot.
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix="envtest-", dir=base))
        self.manifests_dir = manifests_dir
        self.extender_port = free_port()
        self.extender_url = extender_url or f"http://127.0.0.1:{self.extender_port}"
        self.node_monitor_grace_s = node_monitor_grace_s
        self.scheduler_verbosity = scheduler_verbosity
        self.default_scheduler = default_scheduler
        self.power_aware_scheduler = power_aware_scheduler
        self.controllers = controllers  # kube-controller-manager's --controllers
        self.etcd_port = free_port()
        self.apiserver_port = free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.components: dict[str, Component] = {}
        self.pki: Pki | None = None
        self.kubeconfig = self.run_dir / "admin.kubeconfig"
        self._tls: ssl.SSLContext | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.pki = make_pki(self.run_dir / "pki", service_ip=SERVICE_IP)
        self._tls = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        self._tls.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        write_kubeconfig(
            self.kubeconfig,
            self.server,
            self.pki.ca_cert,
            user="admin",
            client_cert=self.pki.admin_cert,
            client_key=self.pki.admin_key,
        )
        self._add(self._etcd()).start()
        self._add(self._apiserver()).start(timeout_s=90)
        self.apply_bootstrap_objects()
        self._add(self._controller_manager()).start()
        if self.default_scheduler:
            self.start_scheduler("default-scheduler", self._default_scheduler_config())
        if self.power_aware_scheduler:
            # Runs as the ServiceAccount the manifests give it: their RBAC is what it gets.
            account = self.service_account_kubeconfig(NAMESPACE, "power-aware-scheduler")
            self.start_scheduler(
                "power-aware-scheduler", self.power_aware_scheduler_config(), kubeconfig=account
            )
        self._wait_for_default_service_account()

    def stop(self) -> None:
        for name in reversed(list(self.components)):
            self.components[name].stop()
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def stop_component(self, name: str) -> None:
        self.components[name].stop()

    def start_component(self, name: str, timeout_s: float = 90.0) -> None:
        """Start a stopped component again, same flags and ports (an API server restart)."""
        component = self.components[name]
        if not component.running:
            component.start(timeout_s)

    def _add(self, component: Component) -> Component:
        self.components[component.name] = component
        return component

    # -- clients -------------------------------------------------------------------------

    def api_client(self, kubeconfig: Path | None = None) -> kubernetes.client.ApiClient:
        """An official-client ApiClient: admin, or whoever `kubeconfig` names."""
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(kubeconfig or self.kubeconfig), client_configuration=configuration
        )
        return kubernetes.client.ApiClient(configuration)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        kubeconfig: Path | None = None,
        check: bool = True,
        timeout_s: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the assets' kubectl against this control plane (admin unless `kubeconfig`)."""
        result = subprocess.run(
            [str(self.assets.kubectl), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} exited with {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path | None = None
    ) -> Path:
        """A kubeconfig holding a fresh token for ServiceAccount namespace/name (TokenRequest)."""
        token = self.kubectl("create", "token", name, "-n", namespace, "--duration=24h").stdout
        path = path or self.run_dir / f"sa-{namespace}-{name}.kubeconfig"
        assert self.pki is not None
        return write_kubeconfig(
            path,
            self.server,
            self.pki.ca_cert,
            user=f"system:serviceaccount:{namespace}:{name}",
            token=token.strip(),
        )

    # -- what the manifests ship ----------------------------------------------------------

    def rendered_manifests(self, directory: Path | None = None) -> list[dict[str, Any]]:
        """`kubectl kustomize DIR` parsed: every object the kustomization builds."""
        result = subprocess.run(
            [str(self.assets.kubectl), "kustomize", str(directory or self.manifests_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ControlPlaneError(f"kubectl kustomize failed: {result.stderr.strip()}")
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    def apply_bootstrap_objects(self) -> None:
        objects = [o for o in self.rendered_manifests() if o.get("kind") in BOOTSTRAP_KINDS]
        # Namespaces first: a server-side apply of one list fails on a namespace not yet made.
        objects.sort(key=lambda o: o["kind"] != "Namespace")
        document = yaml.safe_dump_all(objects)
        self.kubectl("apply", "--server-side", "--field-manager=envtest", "-f", "-", input=document)

    def power_aware_scheduler_config(self) -> dict[str, Any]:
        """The shipped KubeSchedulerConfiguration, made to run here: our extender URL, one
        replica (no leader election); the rest (profiles, extender verbs, weights, timeouts)
        as shipped."""
        namespace, name = SCHEDULER_CONFIG_MAP
        for obj in self.rendered_manifests():
            meta = obj.get("metadata", {})
            if (obj.get("kind"), meta.get("namespace"), meta.get("name")) == (
                "ConfigMap",
                namespace,
                name,
            ):
                config = yaml.safe_load(obj["data"]["config.yaml"])
                break
        else:
            raise ControlPlaneError(f"manifests ship no ConfigMap {namespace}/{name}")
        for extender in config.get("extenders") or []:
            extender["urlPrefix"] = self.extender_url
        # One replica here: with leader election, an API server restarted under a test makes
        # it lose its Lease and exit (in a cluster its pod would be restarted).
        config["leaderElection"] = {"leaderElect": False}
        return config

    def _default_scheduler_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler"}],
        }

    # -- the processes --------------------------------------------------------------------

    def _etcd(self) -> Component:
        peer_port = free_port()
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        return Component(
            "etcd",
            [
                str(self.assets.binary("etcd")),
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--log-level=warn",
            ],
            self.run_dir / "etcd.log",
            lambda: _http_ok(f"{client}/health"),
        )

    def _apiserver(self) -> Component:
        assert self.pki is not None and self._tls is not None
        pki, tls = self.pki, self._tls
        return Component(
            "kube-apiserver",
            [
                str(self.assets.binary("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                # Front-proxy CA: without it every component logs a missing-CA error forever.
                f"--requestheader-client-ca-file={pki.ca_cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                f"--service-account-key-file={pki.service_account_pub}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--api-audiences=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            ],
            self.run_dir / "kube-apiserver.log",
            lambda: _https_ok(f"{self.server}/readyz", tls),
        )

    def _controller_manager(self) -> Component:
        assert self.pki is not None
        port = free_port()
        insecure = _self_signed_tls()
        return Component(
            "kube-controller-manager",
            [
                str(self.assets.binary("kube-controller-manager")),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={self.pki.service_account_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                f"--cluster-signing-cert-file={self.pki.ca_cert}",
                f"--cluster-signing-key-file={self.pki.ca_key}",
                "--leader-elect=false",
                f"--controllers={self.controllers}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.run_dir / 'kcm-certs'}",
                f"--node-monitor-grace-period={self.node_monitor_grace_s}s",
                "--node-monitor-period=1s",
            ],
            self.run_dir / "kube-controller-manager.log",
            lambda: _https_ok(f"https://127.0.0.1:{port}/healthz", insecure),
            port,
        )

    def start_scheduler(
        self,
        name: str,
        config: dict[str, Any],
        *,
        kubeconfig: Path | None = None,
        verbosity: int | None = None,
    ) -> Component:
        """Start a kube-scheduler from a KubeSchedulerConfiguration (its clientConnection set
        here), as `kubeconfig`'s identity (admin by default); a stopped one of the same name
        is replaced."""
        if name in self.components:
            self.components[name].stop()
        kubeconfig = kubeconfig or self.kubeconfig
        config = {**config, "clientConnection": {**config.get("clientConnection", {})}}
        config["clientConnection"]["kubeconfig"] = str(kubeconfig)
        config_path = self.run_dir / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(config))
        port = free_port()
        insecure = _self_signed_tls()
        component = Component(
            name,
            [
                str(self.assets.binary("kube-scheduler")),
                f"--config={config_path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.run_dir / (name + '-certs')}",
                f"-v={self.scheduler_verbosity if verbosity is None else verbosity}",
            ],
            self.run_dir / f"{name}.log",
            lambda: _https_ok(f"https://127.0.0.1:{port}/healthz", insecure),
            port,
        )
        self._add(component).start()
        return component

    def admin_tls(self) -> ssl.SSLContext:
        """A TLS context presenting the admin client certificate (a component's /metrics)."""
        assert self.pki is not None
        context = _self_signed_tls()
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def scheduler_log(self, name: str = "power-aware-scheduler") -> Path:
        return self.components[name].log

    def _wait_for_default_service_account(self, timeout_s: float = 30.0) -> None:
        """Pods need ServiceAccount `default`, which kube-controller-manager makes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
            if result.returncode == 0:
                return
            time.sleep(0.3)
        raise ControlPlaneError("kube-controller-manager made no ServiceAccount default/default")
