"""Which secret file each deployed process must find where: the model and the readers of
the manifests behind ``test_manifest_security.py`` and ``test_manifest_pki.py``.

The model: ``security:`` of ``deploy/hopserve.yaml`` (compose) and
``deploy/k8s/hopserve.yaml`` names the files; the front-end reads all of them, a worker
``security.link`` alone, with its own certificate at the same paths. :data:`ROLE_FILES`
says which ``hopserve security init`` output each (role, key) must be; compose mounts those
files as secrets (long syntax, absolute ``target``), Kubernetes projects the Secrets of
:data:`K8S_SECRETS`, which deploy/README.md creates from the same files, so the two
deployments agree. A missing, swapped or extra mount fails, and so do probes that cannot
speak TLS, workers bound to loopback, key material in a committed file or an environment
variable, and a ``.gitignore`` that would let ``deploy/secrets/`` in.

What ``hopserve security init`` writes is tried with those mounts in
``test_manifest_pki.py``.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from live_prometheus import DEPLOY
from test_manifests import compose, container, hopserve_commands, k8s_objects, parse_cli

from hopserve.config import HopserveConfig
from hopserve.config.security import SecurityConfig

ROOT = DEPLOY.parent
K8S = DEPLOY / "k8s"
SECRETS_DIR = "./secrets/"  # compose secret files, relative to deploy/

ROLE_FILES: dict[str, dict[str, str]] = {
    "frontend": {
        "tls.cert_file": "frontend.crt",
        "tls.key_file": "frontend.key",
        "tokens_file": "tokens.yaml",
        "link.ca_file": "ca.crt",
        "link.cert_file": "frontend-link.crt",  # its client certificate on the link
        "link.key_file": "frontend-link.key",
        "link.token_file": "link.token",
    },
    "worker": {
        "link.ca_file": "ca.crt",
        "link.cert_file": "worker.crt",  # its server certificate
        "link.key_file": "worker.key",
        "link.token_file": "link.token",
    },
}
"""``security:`` key → the ``hopserve security init`` file a process of that role must
find at the key's path."""

NEVER_MOUNTED = {"ca.key", "reader.token", "admin.token"}
"""``init`` output no server process needs: the CA key stays offline, client tokens go to
clients."""

K8S_SECRETS: dict[str, dict[str, tuple[str, str]]] = {
    "frontend": {
        "tls.cert_file": ("hopserve-public-tls", "tls.crt"),
        "tls.key_file": ("hopserve-public-tls", "tls.key"),
        "tokens_file": ("hopserve-tokens", "tokens.yaml"),
        "link.ca_file": ("hopserve-link-ca", "ca.crt"),
        "link.cert_file": ("hopserve-frontend-link-tls", "tls.crt"),
        "link.key_file": ("hopserve-frontend-link-tls", "tls.key"),
        "link.token_file": ("hopserve-link-token", "token"),
    },
    "worker": {
        "link.ca_file": ("hopserve-link-ca", "ca.crt"),
        "link.cert_file": ("hopserve-worker-link-tls", "tls.crt"),
        "link.key_file": ("hopserve-worker-link-tls", "tls.key"),
        "link.token_file": ("hopserve-link-token", "token"),
    },
}
"""``security:`` key → (Secret, key) the Kubernetes pods of that role project there."""

ROLES = {"serve": "frontend", "worker": "worker"}  # hopserve command → role

SECRET_PATTERNS = {
    "a PEM block (key or certificate)": re.compile(r"-----BEGIN [A-Z0-9 ]+-----"),
    "a hopserve token": re.compile(r"\bhs_[A-Za-z0-9_-]{16,}"),
    "a SHA-256 (tokens.yaml entry)": re.compile(r"\b[0-9a-f]{64}\b"),
}
"""What key material looks like; the PKI test checks that ``init``'s output matches."""

READ_METHOD = "/hopserve.v1.EmbeddingService/GetEmbeddings"
RUN_JOB = "/hopserve.v1.WorkerService/RunJob"
PEER = "ipv4:127.0.0.1:40000"


# ---------------------------------------------------------------------------- helpers


def deployed_config(path: Path) -> HopserveConfig:
    """A deploy config as the processes validate it (its paths need not exist here)."""
    return HopserveConfig.model_validate(yaml.safe_load(path.read_text()))


def security_files(security: SecurityConfig, role: str) -> dict[str, str]:
    """``{"tls.cert_file": "/etc/hopserve/tls/frontend.crt", ...}``: the files ``role``
    reads (the front-end: every ``*_file`` of ``security:``; a worker: ``link``'s)."""
    files: dict[str, str] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, f"{prefix}{key}.")
            elif key.endswith("_file") and value is not None:
                files[prefix + key] = value

    walk(security.model_dump(mode="json"), "")
    return {k: v for k, v in files.items() if role == "frontend" or k.startswith("link.")}


def with_files(security: SecurityConfig, visible: Mapping[str, Path]) -> SecurityConfig:
    """``security`` with every file replaced by the host file ``visible`` maps it to."""

    def walk(node: Any, key: str = "") -> Any:
        if isinstance(node, dict):
            return {k: walk(v, k) for k, v in node.items()}
        if key.endswith("_file") and node is not None:
            assert node in visible, f"{key}: {node} is not mounted"
            return str(visible[node])
        return node

    return SecurityConfig.model_validate(walk(security.model_dump(mode="json")))


def parse_in_container(argv: list[str], visible: Mapping[str, Path]) -> tuple[str, dict]:
    """:func:`parse_cli` for a command run in a container that sees ``visible`` (container
    path → host file): click checks that ``--root-certs`` and the like exist, so a command
    naming a file the container lacks fails. Path parameters come back as container paths.
    """
    command, params = parse_cli([str(visible[a]) if a in visible else a for a in argv])
    back = {str(host): path for path, host in visible.items()}
    return command, {k: back.get(str(v), v) if isinstance(v, Path) else v
                     for k, v in params.items()}  # fmt: skip


def dummy_files(paths: list[str], folder: Path) -> dict[str, Path]:
    """An empty host file per container path (for :func:`parse_in_container`)."""
    visible = {}
    for index, path in enumerate(sorted(paths)):
        visible[path] = folder / f"{index}-{posixpath.basename(path)}"
        visible[path].write_text("")
    return visible


# compose


def compose_servers() -> dict[str, tuple[str, dict[str, Any]]]:
    """Compose services that run ``hopserve serve`` / ``worker``: name → (role, params)."""
    found = {}
    for name, service in compose()["services"].items():
        for argv in hopserve_commands(service.get("command", [])):
            command, params = parse_cli(argv)
            if command in ROLES:
                found[name] = (ROLES[command], params)
    return found


def compose_config(service: dict[str, Any], params: dict[str, Any]) -> HopserveConfig:
    """The config file mounted at the service's ``--config``."""
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        if target == str(params["config"]):
            return deployed_config(DEPLOY / source)
    raise AssertionError(f"nothing mounted at {params['config']}")


def compose_secret_files(service: dict[str, Any]) -> dict[str, str]:
    """Container path → host file (relative to deploy/) of the service's secrets."""
    declared = compose().get("secrets") or {}
    files: dict[str, str] = {}
    for entry in service.get("secrets", []):
        assert isinstance(entry, dict), f"{entry}: short syntax mounts at /run/secrets/"
        source = entry["source"]
        target = entry.get("target", source)
        target = target if target.startswith("/") else f"/run/secrets/{target}"
        assert source in declared, f"secret {source} is not declared"
        assert target not in files, f"two secrets at {target}"
        files[target] = declared[source]["file"]
    return files


# Kubernetes


def k8s_files(obj: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """What the container of ``obj`` sees from ConfigMaps and Secrets: container path →
    (``"configMap"`` | ``"secret"``, name, key). Secret sources must list their items."""
    volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
    files: dict[str, tuple[str, str, str]] = {}
    for mount in container(obj).get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "projected" in volume:
            sources = volume["projected"]["sources"]
        elif "secret" in volume:
            ref = dict(volume["secret"], name=volume["secret"]["secretName"])
            sources = [{"secret": ref}]
        elif "configMap" in volume:
            sources = [{"configMap": volume["configMap"]}]
        else:
            continue
        for source in sources:
            ((kind, ref),) = source.items()
            assert kind in ("secret", "configMap"), f"{mount['name']}: {kind} source"
            assert ref.get("items"), f"{mount['name']}: list the {kind} {ref['name']}'s items"
            for item in ref["items"]:
                path = item["path"]
                if mount.get("subPath"):
                    if path != mount["subPath"]:
                        continue
                    path = ""
                target = posixpath.join(mount["mountPath"], path).rstrip("/")
                assert target not in files, f"two files at {target}"
                files[target] = (kind, ref["name"], item["key"])
    return files


def k8s_servers() -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """Workloads whose container runs ``hopserve serve`` / ``worker``: (kind, name) →
    (role, params)."""
    found = {}
    for obj in k8s_objects():
        if "template" not in obj.get("spec", {}):
            continue
        for c in obj["spec"]["template"]["spec"]["containers"]:
            for argv in hopserve_commands(c.get("command", []) + c.get("args", [])):
                command, params = parse_cli(argv)
                if command in ROLES:
                    found[(obj["kind"], obj["metadata"]["name"])] = (ROLES[command], params)
    return found


# documentation


def shell_lines(text: str, prefix: str = "") -> list[list[str]]:
    """The ``hopserve`` and ``kubectl`` command lines of ``text`` (``prefix`` stripped from
    each line, ``\\`` continuations joined, ``#`` comments dropped), split like a shell
    would; prose that merely mentions a command is not a command line."""
    lines = [line.removeprefix(prefix).strip() for line in text.splitlines()]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [
        shlex.split(line, comments=True)
        for line in joined.splitlines() if line.split(" ", 1)[0] in ("hopserve", "kubectl")
    ]  # fmt: skip


def documented_init(text: str, prefix: str = "") -> list[list[str]]:
    return [a for a in shell_lines(text, prefix) if a[:3] == ["hopserve", "security", "init"]]


def compose_header() -> str:
    text = (DEPLOY / "docker-compose.yml").read_text()
    return text[: text.index("\nname:")]


def readme_secrets() -> dict[tuple[str, str], tuple[str, str, str]]:
    """``kubectl create secret`` lines of deploy/README.md: (Secret, key) → (type,
    namespace, the file it is created from)."""
    created = {}
    for argv in shell_lines((DEPLOY / "README.md").read_text()):
        if argv[:1] != ["kubectl"] or "create" not in argv:
            continue
        namespace = argv[argv.index("-n") + 1] if "-n" in argv else "default"
        rest = argv[argv.index("create") + 1 :]
        assert rest[0] == "secret", argv
        kind, name, options = rest[1], rest[2], rest[3:]
        for opt in options:
            flag, _, value = opt.partition("=")
            if flag in ("--cert", "--key"):
                key = "tls.crt" if flag == "--cert" else "tls.key"
            elif flag == "--from-file":
                key, _, value = value.rpartition("=")
                key = key or posixpath.basename(value)
            else:
                continue
            created[(name, key)] = (kind, namespace, value)
    return created
