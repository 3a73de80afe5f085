#!/usr/bin/env python3
"""Checks the fields the deploy examples (harness/deploy/) depend on, beyond their schemas.

check-jsonschema validates the GitHub Actions workflow against the workflow schema it ships;
no Kubernetes schema can be had offline, so the Indexed Job's fields are checked here: that the
shards are one seeded campaign, that each job runs `--shard K/N` with N equal to the matrix /
completion count, and that the reports reach the merge. Needs PyYAML. Exit 0: all good.
"""
import re
import sys

import yaml

DEPLOY = "harness/deploy"
problems = []


def need(cond, what):
    if not cond:
        problems.append(what)


def workflow():
    with open(f"{DEPLOY}/github-actions-campaign.yml") as f:
        wf = yaml.safe_load(f)
    jobs = wf["jobs"]
    shards = jobs["shard"]["strategy"]["matrix"]["shard"]
    need(shards == list(range(1, len(shards) + 1)), f"matrix.shard is not 1..N: {shards}")
    need(str(wf["env"]["SHARDS"]) == str(len(shards)), "env.SHARDS != the matrix length")
    need(jobs["shard"]["strategy"].get("fail-fast") is False, "fail-fast must be false")
    steps = jobs["shard"]["steps"]
    run = " ".join(s.get("run", "") for s in steps)
    need('--shard "${{ matrix.shard }}/$SHARDS"' in run, "the shard job does not pass --shard K/N")
    need("--report" in run and "${{ inputs.seed }}" in run, "no --report or no fixed seed")
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    need(uploads and uploads[0].get("if") == "always()", "the report upload must run always()")
    merge = jobs["merge"]
    need(merge["needs"] == "shard" and merge.get("if") == "always()", "merge needs shard, always")
    msteps = merge["steps"]
    dl = [s for s in msteps if str(s.get("uses", "")).startswith("actions/download-artifact")]
    need(dl and dl[0]["with"].get("merge-multiple") is True, "download every shard's artifact")
    need(any("softverbs campaign merge" in s.get("run", "") for s in msteps), "no merge step")


def k8s():
    with open(f"{DEPLOY}/k8s-indexed-job.yaml") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    job = next(d for d in docs if d["kind"] == "Job")
    need(job["apiVersion"] == "batch/v1", "Job apiVersion must be batch/v1")
    spec = job["spec"]
    need(spec.get("completionMode") == "Indexed", "completionMode must be Indexed")
    n = spec["completions"]
    need(isinstance(n, int) and n >= 1 and spec.get("parallelism", n) <= n, "completions")
    pod = spec["template"]["spec"]
    need(pod.get("restartPolicy") in ("Never", "OnFailure"), "restartPolicy Never/OnFailure")
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    need(env.get("SHARDS") == str(n), f"SHARDS {env.get('SHARDS')} != completions {n}")
    need("SEED" in env and "RUNS" in env, "SEED and RUNS must be fixed for every shard")
    script = " ".join(c.get("command", []) + c.get("args", []))
    need("JOB_COMPLETION_INDEX + 1" in script, "K must be JOB_COMPLETION_INDEX + 1")
    need('--shard "$K/$SHARDS"' in script, "no --shard K/N")
    m = re.search(r'--report "(/[^/]+)/', script)
    mounts = {v["mountPath"]: v["name"] for v in c.get("volumeMounts", [])}
    need(m and m.group(1) in mounts, "the report is not written to a mounted volume")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    need(m and mounts.get(m.group(1)) in vols, "the report volume is not declared")
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for v in vols.values():
        claim = v.get("persistentVolumeClaim", {}).get("claimName")
        need(claim is None or claim in claims, f"claim {claim} is not in the manifest")


def k8s_merge():
    with open(f"{DEPLOY}/k8s-merge-job.yaml") as f:
        job = yaml.safe_load(f)
    need(job["kind"] == "Job" and job["apiVersion"] == "batch/v1", "merge: not a batch/v1 Job")
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    script = " ".join(c.get("command", []) + c.get("args", []))
    need("softverbs campaign merge /reports/report-*.json" in script, "merge: no merge command")
    mounts = {v["mountPath"] for v in c.get("volumeMounts", [])}
    claims = [v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]]
    need("/reports" in mounts and claims == ["softverbs-reports"], "merge: not on the reports claim")


def slurm():
    with open(f"{DEPLOY}/slurm-campaign.sh") as f:
        text = f.read()
    need(re.search(r"^#SBATCH --array=1-\d+", text, re.M), "no #SBATCH --array=1-N")
    need('--shard "$K/$SHARDS"' in text and "K=$SLURM_ARRAY_TASK_ID" in text, "no --shard K/N")


workflow()
k8s()
k8s_merge()
slurm()
for p in problems:
    print(f"check-deploy: {p}", file=sys.stderr)
print("check-deploy: " + ("FAILED" if problems else "workflow, Indexed Job and Slurm array ok"))
sys.exit(1 if problems else 0)
