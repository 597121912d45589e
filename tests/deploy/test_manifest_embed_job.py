"""``deploy/k8s/embed-all-job.yaml``: the all-node embedding job (an Indexed Job running
``torchrun -m hopserve embed-all``), checked like the serving manifests: the torchrun and
hopserve command lines parse with the real parsers, the ranks, rendezvous address and
DNS agree, and the model is the one the serving config serves."""

from __future__ import annotations

import json
from typing import Any

import yaml
from test_manifests import K8S, container, parse_cli

from hopserve.config import load_config

JOB = K8S / "embed-all-job.yaml"


def objects() -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in yaml.safe_load_all(JOB.read_text()) if o}


def torchrun_and_hopserve(command: list[str]) -> tuple[Any, tuple[str, dict[str, Any]]]:
    """``torchrun [options] -m hopserve ...``, split and parsed by each tool's parser, with
    ``$(JOB_COMPLETION_INDEX)`` expanded to 1 as the kubelet would on pod 1."""
    from torch.distributed.run import get_args_parser

    assert command[0] == "torchrun" and "-m" in command, command
    command = [arg.replace("$(JOB_COMPLETION_INDEX)", "1") for arg in command]
    cut = command.index("-m")
    assert command[cut + 1] == "hopserve", command
    torchrun = get_args_parser().parse_args([*command[1:cut], "-m", "hopserve"])
    return torchrun, parse_cli(command[cut + 1 :])


def test_the_job_is_indexed_and_every_rank_runs_at_once() -> None:
    job = objects()["Job"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] >= 1
    assert spec["backoffLimit"] >= 1  # a failed rank: recreated, resumes from checkpoints
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert "embed-all-job.yaml" not in (K8S / "kustomization.yaml").read_text()


def test_torchrun_ranks_and_rendezvous_match_the_job_and_its_dns() -> None:
    objs = objects()
    job, service = objs["Job"], objs["Service"]
    c = container(job)
    torchrun, (path, params) = torchrun_and_hopserve(c["command"])
    assert path == "embed-all"
    assert torchrun.module and torchrun.training_script == "hopserve"
    assert torchrun.nnodes == str(job["spec"]["completions"])
    assert torchrun.nproc_per_node == "1"
    assert "--node-rank=$(JOB_COMPLETION_INDEX)" in c["command"]  # expanded by the kubelet
    assert torchrun.node_rank == 1
    (index,) = [e for e in c["env"] if e["name"] == "JOB_COMPLETION_INDEX"]
    assert "job-completion-index" in index["valueFrom"]["fieldRef"]["fieldPath"]
    # Pod 0 of the Job is reachable as <job>-0.<subdomain>; the subdomain is the
    # headless Service that selects the Job's pods.
    template = job["spec"]["template"]
    assert template["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert torchrun.master_addr == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert str(torchrun.master_port) == str(service["spec"]["ports"][0]["port"])
    labels = template["metadata"]["labels"]
    assert all(labels[k] == v for k, v in service["spec"]["selector"].items())
    assert params["device"] == "cuda"
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == c["resources"]["requests"]["nvidia.com/gpu"] == 1


def test_it_embeds_the_served_model_and_writes_to_its_own_volume() -> None:
    (model, *_) = load_config(K8S / "hopserve.yaml", env={}).models
    c = container(objects()["Job"])
    _, (_, params) = torchrun_and_hopserve(c["command"])
    assert params["entrypoint"] == model.entrypoint
    assert str(params["weights"]) == str(model.weights)
    assert str(params["graph"]) == str(model.graph)
    assert json.loads(params["kwargs"]) == model.kwargs
    assert (params["name"], params["model_version"]) == (model.name, model.version)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True
    assert str(params["out"]).startswith("/out/") and not mounts["/out"].get("readOnly")
    assert str(params["checkpoint_dir"]).startswith("/out/")
    volumes = {v["name"]: v for v in job_volumes()}
    claim = volumes[mounts["/out"]["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == objects()["PersistentVolumeClaim"]["metadata"]["name"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def job_volumes() -> list[dict[str, Any]]:
    return objects()["Job"]["spec"]["template"]["spec"]["volumes"]
