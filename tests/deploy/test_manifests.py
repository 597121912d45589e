"""docker compose, Dockerfiles and Kubernetes manifests against the code they deploy.

Every file parses (``yaml.safe_load_all``); every ``hopserve ...`` command line is parsed
by the real Typer app (unknown commands or options, bad values fail); ports, addresses,
health service names and the Redis eviction policy agree with the configs, which load
with :func:`hopserve.config.load_config` (paths need not exist: ``load_config``
does not check them, ``validate_paths`` would, and the deployed paths live in volumes).

One module (about 440 lines): the compose and Kubernetes readers, which
``secret_mounts.py`` reuses, next to the checks that use them.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
import yaml
from live_prometheus import DEPLOY

from hopserve.cli import app
from hopserve.config import HopserveConfig, load_config
from hopserve.worker.runtime import allocator
from hopserve.worker.service import SERVICE_NAME as WORKER_SERVICE

ROOT = DEPLOY.parent

COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
CLI = typer.main.get_command(app)


# ---------------------------------------------------------------------------- helpers


def parse_cli(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse a ``hopserve ...`` command line like the CLI would, without running it.

    Typer's click objects are used by duck typing (Typer >= 0.2x vendors click).

    Returns:
        (the command path, e.g. ``"synth sbm"``, the parsed parameters).
    """
    assert argv[0] == "hopserve", argv
    command: Any = CLI
    ctx = typer.Context(CLI, info_name="hopserve")
    args = list(argv[1:])
    path = []
    while getattr(command, "commands", None) is not None:  # a group: take a subcommand
        assert args, f"{argv}: missing subcommand"
        name = args.pop(0)
        sub = command.get_command(ctx, name)
        assert sub is not None, f"{argv}: no command {name!r} (have {sorted(command.commands)})"
        path.append(name)
        command = sub
        if getattr(command, "commands", None) is not None:
            ctx = typer.Context(command, info_name=name, parent=ctx)
    try:
        sub_ctx = command.make_context(path[-1], args, parent=ctx)
    except Exception as err:  # click's UsageError / BadParameter / NoSuchOption
        message = err.format_message() if hasattr(err, "format_message") else str(err)
        pytest.fail(f"{argv}: {type(err).__name__}: {message}")
    return " ".join(path), dict(sub_ctx.params)


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a ``sh -c`` script (split at ``;``, ``&&``, ``||``, ``|``)."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in (";", "&&", "||", "|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def hopserve_commands(command: list[str]) -> list[list[str]]:
    """``hopserve`` invocations in a container command (direct or inside ``sh -c``)."""
    if command[:2] == ["sh", "-c"]:
        return [c for c in shell_commands(command[2]) if c[0] == "hopserve"]
    return [command] if command and command[0] == "hopserve" else []


def option(params: dict[str, Any], name: str) -> Any:
    return params[name]


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def config_at(compose_path: str) -> HopserveConfig:
    """The config a container reads, from the host file mounted at ``compose_path``."""
    assert compose_path == "/etc/hopserve/hopserve.yaml"
    return load_config(DEPLOY / "hopserve.yaml", env={})


def k8s_objects() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    objects = []
    for resource in kustomization["resources"]:
        objects += [d for d in yaml.safe_load_all((K8S / resource).read_text()) if d]
    return objects


def k8s(kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# ---------------------------------------------------------------------------- configs


@pytest.mark.parametrize("path", [DEPLOY / "hopserve.yaml", K8S / "hopserve.yaml"],
                         ids=["compose", "k8s"])  # fmt: skip
def test_deploy_configs_load(path: Path) -> None:
    config = load_config(path, env={})
    assert [m.name for m in config.models] == ["sage"]
    assert config.models[0].entrypoint == "hopserve.examples:GraphSAGE"
    assert config.server.workers, "the deployments run remote workers"
    assert config.cache.backend == "redis"
    assert all(str(p).startswith("/data/") for p in (config.models[0].graph,
                                                     config.models[0].weights))  # fmt: skip


def test_compose_and_k8s_configs_differ_only_in_addresses() -> None:
    compose_cfg = load_config(DEPLOY / "hopserve.yaml", env={}).model_dump(mode="json")
    k8s_cfg = load_config(K8S / "hopserve.yaml", env={}).model_dump(mode="json")
    for cfg in (compose_cfg, k8s_cfg):
        cfg["server"].pop("workers")
    assert compose_cfg == k8s_cfg


def test_all_yaml_parses() -> None:
    files = [*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")]
    assert len(files) >= 14
    for path in files:
        docs = list(yaml.safe_load_all(path.read_text()))
        assert docs and all(isinstance(d, dict) for d in docs if d is not None), path


# ---------------------------------------------------------------------------- compose


def test_compose_services() -> None:
    services = compose()["services"]
    assert set(services) == {"hopserve-redis", "hopserve-seed", "hopserve",
                             "hopserve-worker-gpu", "hopserve-worker-cpu", "prometheus",
                             "grafana"}  # fmt: skip
    declared = set(compose()["volumes"])
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("."):
                assert source in declared, f"{name}: volume {source} not declared"
            else:
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"


def test_compose_commands_are_real_cli_commands() -> None:
    seen = set()
    for name, service in compose()["services"].items():
        for argv in hopserve_commands(service.get("command", [])):
            command, _params = parse_cli(argv)
            seen.add((name, command))
    assert seen == {("hopserve-seed", "synth sbm"), ("hopserve", "serve"),
                    ("hopserve-worker-gpu", "worker"), ("hopserve-worker-cpu", "worker")}  # fmt: skip


def test_compose_frontend() -> None:
    service = compose()["services"]["hopserve"]
    _, params = parse_cli(service["command"])
    config = config_at(str(params["config"]))
    assert service["ports"] == [f"{config.server.port}:{config.server.port}"]
    assert service["expose"] == [str(config.server.metrics_port)]
    assert "./hopserve.yaml:/etc/hopserve/hopserve.yaml:ro" in service["volumes"]
    redis_host, redis_port = (
        config.cache.redis_url.get_secret_value().split("//")[1].split("/")[0].split(":")
    )
    assert redis_host in compose()["services"] and int(redis_port) == 6379


def test_compose_workers() -> None:
    services = compose()["services"]
    config = load_config(DEPLOY / "hopserve.yaml", env={})
    (address,) = config.server.workers
    host, port = host_port(address)
    profiles = {}
    for name, device in (("hopserve-worker-gpu", "cuda:0"), ("hopserve-worker-cpu", "cpu")):
        service = services[name]
        _, params = parse_cli(service["command"])
        assert params["device"] == device
        assert params["port"] == port
        assert service["networks"]["default"]["aliases"] == [host]
        assert service["expose"] == [str(port)]
        (profiles[name],) = service["profiles"]
        health = service["healthcheck"]["test"]  # TLS: test_manifest_security.py
        assert health[:3] == ["CMD", "hopserve", "health"]
        assert f"127.0.0.1:{port}" in health and WORKER_SERVICE in health
    assert profiles == {"hopserve-worker-gpu": "gpu", "hopserve-worker-cpu": "cpu"}
    gpu = services["hopserve-worker-gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    ]
    assert "deploy" not in services["hopserve-worker-cpu"]
    env = dict(
        line.split("=", 1) for line in (DEPLOY / ".env").read_text().splitlines()
        if line and not line.startswith("#")
    )  # fmt: skip
    assert env["COMPOSE_PROFILES"] in profiles.values()


def recommended_redis_policy() -> str:
    """``maxmemory-policy`` recommended by server/cache/README.md."""
    text = (ROOT / "server" / "cache" / "README.md").read_text()
    (policy,) = re.findall(r"^maxmemory-policy (\S+)$", text, re.M)
    return policy


def redis_settings(args: list[str]) -> dict[str, str]:
    if args and args[0] == "redis-server":
        args = args[1:]
    return {args[i].lstrip("-"): args[i + 1] for i in range(0, len(args), 2)}


def test_compose_redis_is_a_cache() -> None:
    settings = redis_settings(compose()["services"]["hopserve-redis"]["command"])
    assert settings["maxmemory-policy"] == recommended_redis_policy() == "allkeys-lru"
    assert re.fullmatch(r"\d+[kmg]b", settings["maxmemory"])
    assert settings["save"] == "" and settings["appendonly"] == "no"


def test_compose_seed_matches_the_model(tmp_path: Path) -> None:
    """The seed service's graph has the model's input dimension, and the weights it
    writes load into the configured model (hopserve's own loader, strict)."""
    from hopserve.worker.loader import load_model

    command = compose()["services"]["hopserve-seed"]["command"]
    config = load_config(DEPLOY / "hopserve.yaml", env={})
    model = config.models[0]
    (synth,) = hopserve_commands(command)
    _, params = parse_cli(synth)
    assert params["dim"] == model.kwargs["in_dim"]
    assert str(params["out"]) == str(model.graph)
    (python,) = [c for c in shell_commands(command[2]) if c[0] == "python"]
    code = python[2].replace(str(model.weights), str(tmp_path / "w.pt"))
    assert code != python[2], "the seed writes the configured weights file"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    load_model(model.entrypoint, model.kwargs, tmp_path / "w.pt")


def test_compose_prometheus_and_grafana_mounts() -> None:
    services = compose()["services"]
    prometheus = services["prometheus"]
    assert "./prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert (DEPLOY / "prometheus" / "prometheus.yml").is_file()
    grafana = services["grafana"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]


# ---------------------------------------------------------------------------- Dockerfiles


def dockerfile(name: str) -> list[tuple[str, str]]:
    """``(instruction, arguments)`` of a Dockerfile, continuation lines joined."""
    text = (DEPLOY / "docker" / name).read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines if line and not line.startswith("#")
    ]  # fmt: skip


EXTRAS = {
    "Dockerfile.frontend": "frontend",  # no torch
    "Dockerfile.cpu": "serve,pyg",
    "Dockerfile.worker": "serve,pyg",
}


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_dockerfile_copies_the_package_and_runs_the_cli(name: str) -> None:
    import json

    instructions = dockerfile(name)
    copied = set()
    for op, args in instructions:
        if op == "COPY":
            *sources, _dest = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"{name}: COPY {source}: not in the repo"
                copied.add(source)
    setup = (ROOT / "setup.py").read_text()
    folders = set(re.findall(r'"hopserve(?:\.\w+)?": "(\w+)"', setup))
    assert folders <= copied, f"{name}: package folders not copied: {folders - copied}"
    assert {"pyproject.toml", "setup.py", "README.md"} <= copied
    extras = EXTRAS[name]
    assert any(op == "RUN" and f'pip install ".[{extras}]"' in args for op, args in instructions)
    (cmd,) = [json.loads(args) for op, args in instructions if op == "CMD"]
    parse_cli(cmd)
    ignore = (DEPLOY / "docker" / f"{name}.dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:1] == ["*"]
    assert {f"!{source}" for source in copied} <= set(ignore)


def test_cpu_image_torch_pin_matches_the_makefile() -> None:
    (makefile_pin,) = re.findall(r"^TORCH\s*\?=\s*torch==(\S+)$",
                                 (ROOT / "Makefile").read_text(), re.M)  # fmt: skip
    args = dict(a.split("=", 1) for op, a in dockerfile("Dockerfile.cpu") if op == "ARG")
    assert args["TORCH_VERSION"] == makefile_pin
    assert any("download.pytorch.org/whl/cpu" in a for op, a in dockerfile("Dockerfile.cpu"))


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.worker"])
def test_worker_images_preload_tcmalloc(name: str) -> None:
    """glibc keeps a worker's freed batch memory fragmented (worker/runtime/allocator.py):
    the worker images install tcmalloc, link it to one path and preload it."""
    instructions = dockerfile(name)
    link = "/usr/local/lib/libtcmalloc_minimal.so.4"
    (run,) = [a for op, a in instructions if op == "RUN" and "libtcmalloc-minimal4" in a]
    assert "apt-get install" in run and "ln -s" in run and run.rstrip().endswith(link)
    env = [a.split() for op, a in instructions if op == "ENV"]
    assert any(f"LD_PRELOAD={link}" in words for words in env)
    assert Path(link).parent.as_posix() in allocator._SEARCH[:1]  # found first there


def test_frontend_image_has_no_torch() -> None:
    """The front-end needs no torch (tests/server/e2e/test_torch_free.py): its image has
    none, and its extra pulls none in."""
    import tomllib

    text = " ".join(a for _, a in dockerfile("Dockerfile.frontend"))
    assert "torch" not in text.replace("'torch'", "").replace("torch in the", "")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    frontend = extras["optional-dependencies"]["frontend"]
    assert not [d for d in frontend if d.split("[")[0].split(">")[0] in ("torch", "hopserve")]
    assert all("torch" not in d for d in extras["dependencies"] + frontend)


def test_worker_image_is_a_cuda_pytorch_image() -> None:
    args = dict(a.split("=", 1) for op, a in dockerfile("Dockerfile.worker") if op == "ARG")
    assert re.fullmatch(r"pytorch/pytorch:2\.\d+\.\d+-cuda12\.\d+-cudnn9-runtime",
                        args["BASE_IMAGE"])  # fmt: skip
    torch_minor = tuple(int(x) for x in args["BASE_IMAGE"].split(":")[1].split("-")[0].split("."))
    assert torch_minor >= (2, 2, 1), "pyproject: torch>=2.2.1"


# ---------------------------------------------------------------------------- Kubernetes


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return c


def test_kustomization_resources_and_config() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file()
    (generator,) = kustomization["configMapGenerator"]
    assert generator["files"] == ["hopserve.yaml"]
    for kind, name in (("Deployment", "hopserve"), ("StatefulSet", "hopserve-worker")):
        obj = k8s(kind, name)
        volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
        sources = volumes["config"]["projected"]["sources"]  # + Secrets: test_manifest_security
        (config_map,) = [s["configMap"] for s in sources if "configMap" in s]
        assert config_map["name"] == generator["name"]
        assert config_map["items"] == [{"key": "hopserve.yaml", "path": "hopserve.yaml"}]
        mounts = {m["name"]: m["mountPath"] for m in container(obj)["volumeMounts"]}
        _, params = parse_cli(container(obj)["command"])
        assert Path(mounts["config"]) / "hopserve.yaml" == params["config"]
        claim = volumes["data"]["persistentVolumeClaim"]["claimName"]
        assert k8s("PersistentVolumeClaim", claim)
        assert mounts["data"] == "/data"
    assert {o["metadata"].get("namespace") for o in k8s_objects()} == {None}  # kustomize sets it
    assert kustomization["namespace"] == k8s("Namespace", "hopserve")["metadata"]["name"]


def ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c["ports"]}


def test_k8s_frontend() -> None:
    config = load_config(K8S / "hopserve.yaml", env={})
    deployment = k8s("Deployment", "hopserve")
    c = container(deployment)
    command, _ = parse_cli(c["command"])
    assert command == "serve"
    assert ports(c) == {"grpc": config.server.port, "metrics": config.server.metrics_port}
    # TLS on the gRPC port: no kubelet gRPC probe (test_manifest_security.py)
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(config.server.metrics_port)
    assert annotations["prometheus.io/path"] == "/metrics"
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > config.server.grace_period_s
    service = k8s("Service", "hopserve")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "grpc": (config.server.port, "grpc"),
        "metrics": (config.server.metrics_port, "metrics"),
    }
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_k8s_workers_match_server_workers() -> None:
    config = load_config(K8S / "hopserve.yaml", env={})
    workers = k8s("StatefulSet", "hopserve-worker")
    service = k8s("Service", workers["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"  # one DNS name per pod
    name, governing = workers["metadata"]["name"], service["metadata"]["name"]
    expected = [
        f"{name}-{i}.{governing}:{service['spec']['ports'][0]['port']}"
        for i in range(workers["spec"]["replicas"])
    ]
    assert config.server.workers == expected
    c = container(workers)
    _, params = parse_cli(c["command"])
    assert params["device"].startswith("cuda")
    assert ports(c) == {"grpc": params["port"]} == {"grpc": service["spec"]["ports"][0]["port"]}
    for probe in ("startupProbe", "readinessProbe"):  # mutual TLS: test_manifest_security.py
        command = c[probe]["exec"]["command"]
        assert command[:2] == ["hopserve", "health"] and WORKER_SERVICE in command
        assert f"127.0.0.1:{params['port']}" in command
    assert c["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    resources = c["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == 1
    assert service["spec"]["selector"] == workers["spec"]["selector"]["matchLabels"]


def test_k8s_redis_is_a_cache() -> None:
    config = load_config(K8S / "hopserve.yaml", env={})
    deployment = k8s("Deployment", "hopserve-redis")
    c = container(deployment)
    settings = redis_settings(c["args"])
    assert settings["maxmemory-policy"] == recommended_redis_policy()
    assert settings["save"] == "" and settings["appendonly"] == "no"
    maxmemory = int(settings["maxmemory"].removesuffix("gb"))
    limit = int(c["resources"]["limits"]["memory"].removesuffix("Gi"))
    assert maxmemory < limit, "Redis needs headroom above maxmemory"
    url = config.cache.redis_url.get_secret_value()
    service = k8s("Service", "hopserve-redis")
    assert url == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    assert ports(c)["redis"] == 6379
