"""TLS and tokens in the deploy manifests: every file ``security:`` names reaches the
process that reads it from a secret, at exactly that path, and nothing else does (the
model is ``secret_mounts.py``'s). A missing, swapped or extra mount fails, and so do
probes that cannot speak TLS, workers bound to loopback, key material in a committed file
or an environment variable, and a ``.gitignore`` that would let ``deploy/secrets/`` in.
"""

from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_prometheus import DEPLOY
from secret_mounts import (
    K8S,
    K8S_SECRETS,
    ROLE_FILES,
    ROOT,
    SECRET_PATTERNS,
    SECRETS_DIR,
    compose_config,
    compose_header,
    compose_secret_files,
    compose_servers,
    deployed_config,
    documented_init,
    dummy_files,
    k8s_files,
    k8s_servers,
    parse_in_container,
    readme_secrets,
    security_files,
)
from test_manifests import compose, container, hopserve_commands, k8s, k8s_objects, parse_cli

from hopserve.worker.service import SERVICE_NAME as WORKER_SERVICE

# ---------------------------------------------------------------------------- configs


@pytest.mark.parametrize("path", [DEPLOY / "hopserve.yaml", K8S / "hopserve.yaml"],
                         ids=["compose", "k8s"])  # fmt: skip
def test_configs_turn_on_tls_tokens_and_the_secure_link(path: Path) -> None:
    config = deployed_config(path)
    sec = config.security
    assert config.server.host == "0.0.0.0"
    assert sec.tls is not None and sec.tokens_file is not None
    assert sec.tokens_env is None, "tokens come from a mounted file, not the environment"
    assert 0 < sec.rate_limit.requests_per_s <= (sec.rate_limit.burst or 0)
    assert sec.link.tls and sec.link.token_file is not None
    host = config.server.workers[0].rpartition(":")[0]
    assert sec.link.server_name == "hopserve-worker" == host.split(".")[-1]
    for role, keys in ROLE_FILES.items():
        files = security_files(sec, role)
        assert set(files) == set(keys), f"{role}: security: names {sorted(files)}"
        assert all(p.startswith("/etc/hopserve/") for p in files.values()), files


def test_gitignore_keeps_deploy_secrets_out() -> None:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert {"deploy/secrets/", "/deploy/secrets/"} & set(lines)
    if shutil.which("git") and (ROOT / ".git").exists():
        for name in ("ca.key", "frontend.key", "link.token", "tokens.yaml"):
            check = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index",
                                    f"deploy/secrets/{name}"], timeout=30)  # fmt: skip
            assert check.returncode == 0, f"deploy/secrets/{name} is not git-ignored"


def test_no_secret_material_under_deploy() -> None:
    scanned = 0
    for path in sorted(DEPLOY.rglob("*")):
        parts = path.relative_to(DEPLOY).parts
        if not path.is_file() or parts[0] == "secrets" or "__pycache__" in parts:
            continue
        try:
            text = path.read_text("utf-8")
        except UnicodeDecodeError:
            continue  # the dashboard pictures
        scanned += 1
        for what, pattern in SECRET_PATTERNS.items():
            assert not pattern.search(text), f"{path.relative_to(ROOT)}: {what}"
    assert scanned >= 25


def environments() -> Iterator[tuple[str, bool, list[dict[str, Any]]]]:
    """(where, runs hopserve, env entries as ``{name, value | valueFrom}``) per compose
    service and Kubernetes container."""
    for name, service in compose()["services"].items():
        env = service.get("environment") or {}
        if isinstance(env, list):
            env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
        entries = [{"name": k, "value": None if v is None else str(v)} for k, v in env.items()]
        yield f"compose {name}", bool(hopserve_commands(service.get("command", []))), entries
    for obj in k8s_objects():
        if "template" not in obj.get("spec", {}):
            continue
        for c in obj["spec"]["template"]["spec"]["containers"]:
            runs = c.get("command", [""])[0] == "hopserve"
            entries = list(c.get("env", [])) + [{"name": "envFrom", "valueFrom": e}
                                                for e in c.get("envFrom", [])]  # fmt: skip
            yield f"{obj['kind']} {obj['metadata']['name']}/{c['name']}", runs, entries


def test_no_secret_in_an_environment_variable() -> None:
    seen = set()
    for where, runs_hopserve, entries in environments():
        seen.add(where.split()[0])
        for entry in entries:
            value = entry.get("value") or ""
            for what, pattern in SECRET_PATTERNS.items():
                assert not pattern.search(value), f"{where}: {entry['name']} holds {what}"
            if runs_hopserve:  # its tokens and keys come from files only
                assert not re.match(r"HOPSERVE_(TOKEN|SECURITY__)", entry["name"]), where
                assert "secretKeyRef" not in str(entry.get("valueFrom", "")), where
                assert "secretRef" not in str(entry.get("valueFrom", "")), where
    assert seen == {"compose", "Deployment", "StatefulSet"}


# ---------------------------------------------------------------------------- compose


def test_compose_servers() -> None:
    servers = compose_servers()
    assert {n: r for n, (r, _) in servers.items()} == {
        "hopserve": "frontend", "hopserve-worker-gpu": "worker", "hopserve-worker-cpu": "worker"
    }  # fmt: skip


@pytest.mark.parametrize("name", ["hopserve", "hopserve-worker-gpu", "hopserve-worker-cpu"])
def test_compose_mounts_exactly_the_secrets_each_process_reads(name: str) -> None:
    """Every file the container's config names, from the right ``init`` file: a missing,
    swapped or extra mount (another role's key, the CA key) fails."""
    service = compose()["services"][name]
    role, params = compose_servers()[name]
    security = compose_config(service, params).security
    want = {
        path: SECRETS_DIR + ROLE_FILES[role][key]
        for key, path in security_files(security, role).items()
    }
    assert compose_secret_files(service) == want
    for volume in service.get("volumes", []):  # nothing shadows or bypasses the secrets
        source, target = volume.split(":")[:2]
        assert not source.startswith(("./secrets", "secrets")), f"{name}: mounts {source}"
        assert not any(p.startswith(target.rstrip("/") + "/") for p in want), (name, target)


def test_compose_secrets_section() -> None:
    declared = compose()["secrets"]
    needed = {f for files in ROLE_FILES.values() for f in files.values()}
    assert {s["file"] for s in declared.values()} == {SECRETS_DIR + f for f in needed}
    assert all(set(s) == {"file"} for s in declared.values()), "files, not environment"
    used = set()
    for name, service in compose()["services"].items():
        if name not in compose_servers():
            assert "secrets" not in service, f"{name} needs no hopserve secret"
        used |= {e["source"] for e in service.get("secrets", [])}
    assert used == set(declared)


def test_init_command_is_documented() -> None:
    """The command in the compose header and deploy/README.md writes ``./secrets/`` with
    certificates for the names clients and the front-end use."""
    config = deployed_config(DEPLOY / "hopserve.yaml")
    worker_host = config.server.workers[0].rpartition(":")[0]
    readme = (DEPLOY / "README.md").read_text()
    (header,) = documented_init(compose_header(), "#")
    assert header in documented_init(readme)
    command, params = parse_cli(header)
    assert command == "security init"
    assert str(params["out"]) == "secrets"  # = SECRETS_DIR, next to the compose file
    assert {"localhost", "hopserve"} <= set(params["public_name"])  # README's query; the service
    assert {worker_host, config.security.link.server_name} <= set(params["worker_name"])
    k8s_names = {n for argv in documented_init(readme) if argv != header
                 for n in parse_cli(argv)[1]["worker_name"]}  # fmt: skip
    assert deployed_config(K8S / "hopserve.yaml").security.link.server_name in k8s_names


def test_compose_healthchecks(tmp_path: Path) -> None:
    services = compose()["services"]
    config = deployed_config(DEPLOY / "hopserve.yaml")
    frontend = services["hopserve"]["healthcheck"]["test"]
    assert frontend[0] == "CMD" and "grpc" not in " ".join(frontend)  # TLS: no plain gRPC
    assert f"'http://127.0.0.1:{config.server.metrics_port}/healthz'" in frontend[-1]
    for name in ("hopserve-worker-gpu", "hopserve-worker-cpu"):
        service = services[name]
        _, worker = parse_cli(service["command"])
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD"
        visible = dummy_files(list(compose_secret_files(service)), tmp_path)
        command, params = parse_in_container(test[1:], visible)
        link = config.security.link
        assert command == "health"
        assert params["target"] == f"127.0.0.1:{worker['port']}"
        assert params["service"] == WORKER_SERVICE
        assert (params["root_certs"], params["client_cert"], params["client_key"]) == (
            str(link.ca_file), str(link.cert_file), str(link.key_file))  # fmt: skip


def test_workers_bind_every_interface() -> None:
    workers = [p for r, p in compose_servers().values() if r == "worker"]
    workers += [p for r, p in k8s_servers().values() if r == "worker"]
    assert len(workers) == 3
    assert all(p["host"] == "0.0.0.0" for p in workers)


# ---------------------------------------------------------------------------- Kubernetes


def test_k8s_servers() -> None:
    assert {k: r for k, (r, _) in k8s_servers().items()} == {
        ("Deployment", "hopserve"): "frontend", ("StatefulSet", "hopserve-worker"): "worker"
    }  # fmt: skip


@pytest.mark.parametrize("kind, name", [("Deployment", "hopserve"),
                                        ("StatefulSet", "hopserve-worker")])  # fmt: skip
def test_k8s_mounts_exactly_the_secrets_each_process_reads(kind: str, name: str) -> None:
    obj = k8s(kind, name)
    role, params = k8s_servers()[(kind, name)]
    files = k8s_files(obj)
    generator = yaml.safe_load((K8S / "kustomization.yaml").read_text())["configMapGenerator"]
    assert files[str(params["config"])] == ("configMap", generator[0]["name"], "hopserve.yaml")
    security = deployed_config(K8S / "hopserve.yaml").security
    want = {
        path: ("secret", *K8S_SECRETS[role][key])
        for key, path in security_files(security, role).items()
    }
    assert {p: f for p, f in files.items() if f[0] == "secret"} == want
    volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
    for mount in container(obj)["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "secret" in str(volume):
            assert mount.get("readOnly") is True, mount
            source = volume.get("projected") or volume.get("secret")
            assert source["defaultMode"] in (0o400, 0o440), mount["name"]
    assert obj["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001  # 0440 reads


def test_readme_creates_every_k8s_secret_from_the_file_compose_mounts() -> None:
    """deploy/README.md's ``kubectl create secret`` lines fill each (Secret, key) the pods
    project from the same ``init`` file compose mounts at that path (in the folder the
    README's Kubernetes ``init`` writes); certificates as ``kubernetes.io/tls`` Secrets,
    in the namespace the kustomization deploys to."""
    created = readme_secrets()
    (header,) = documented_init(compose_header(), "#")
    (init,) = [a for a in documented_init((DEPLOY / "README.md").read_text()) if a != header]
    out = str(parse_cli(init)[1]["out"])
    namespace = yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]
    referenced = set()
    for obj in (k8s("Deployment", "hopserve"), k8s("StatefulSet", "hopserve-worker")):
        referenced |= {(f[1], f[2]) for f in k8s_files(obj).values() if f[0] == "secret"}
    assert referenced <= set(created), f"not created: {referenced - set(created)}"
    for role, keys in K8S_SECRETS.items():
        for key, secret in keys.items():
            kind, ns, file = created[secret]
            assert file == posixpath.join(out, ROLE_FILES[role][key]), (role, key, secret)
            assert ns == namespace
            assert kind == ("tls" if secret[1] in ("tls.crt", "tls.key") else "generic")


def probes(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c}


def test_k8s_probes_speak_tls_or_use_the_metrics_port(tmp_path: Path) -> None:
    """kubelet's gRPC probes cannot do TLS: none on a hopserve container. The front-end is
    ready by ``/healthz``; a worker by ``hopserve health`` with its link certificate."""
    config = deployed_config(K8S / "hopserve.yaml")
    assert config.security.tls is not None and config.security.link.tls  # both ports TLS
    for (kind, name), (role, params) in k8s_servers().items():
        c = container(k8s(kind, name))
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        checks = probes(c)
        assert all("grpc" not in p for p in checks.values()), f"{name}: a gRPC probe"
        liveness = checks["livenessProbe"]
        if "tcpSocket" in liveness:
            assert liveness["tcpSocket"]["port"] in ports
        if role == "frontend":
            ready = checks["readinessProbe"]["httpGet"]
            assert ready["path"] == "/healthz"
            assert ports[ready["port"]] == config.server.metrics_port
            continue
        visible = dummy_files([p for p, f in k8s_files(k8s(kind, name)).items()], tmp_path)
        link = config.security.link
        for probe in ("startupProbe", "readinessProbe"):
            command, health = parse_in_container(checks[probe]["exec"]["command"], visible)
            assert command == "health", probe
            assert health["target"] == f"127.0.0.1:{params['port']}"
            assert health["service"] == WORKER_SERVICE
            assert (health["root_certs"], health["client_cert"], health["client_key"]) == (
                str(link.ca_file), str(link.cert_file), str(link.key_file))  # fmt: skip
            assert checks[probe]["timeoutSeconds"] > health["timeout"], "python starts slowly"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renames_the_projected_config_map() -> None:
    """The generated ConfigMap's hashed name reaches the projected volumes."""
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True,
                         timeout=60, check=True).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d]
    (config_map,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"]
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet") and doc["metadata"]["name"] != (
            "hopserve-redis"
        ):
            volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}
            sources = volumes["config"]["projected"]["sources"]
            assert [s["configMap"]["name"] for s in sources if "configMap" in s] == [config_map]
