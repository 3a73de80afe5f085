#!/usr/bin/env bash
# Validates the deploy examples of harness/deploy/ (README: "Campaigns at scale"):
#   * the GitHub Actions workflow against the workflow JSON schema check-jsonschema ships
#     (--builtin-schema vendor.github-workflows: no download);
#   * every YAML file with yamllint (harness/deploy/.yamllint);
#   * the Slurm script with bash -n;
#   * the fields the examples depend on (scripts/check-deploy.py: shard count = matrix /
#     completions, --shard K/N from the index, reports to a volume or an artifact, the merge).
# check-jsonschema and yamllint are installed from PyPI into a temporary venv.
# Exit 0 all good; 1 a check failed; 3 the linters could not be installed (the caller says so).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
D=harness/deploy
bash -n "$D/slurm-campaign.sh"
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
if ! python3 -m venv "$venv" >/dev/null 2>&1 ||
  ! "$venv/bin/pip" install -q --disable-pip-version-check yamllint check-jsonschema >/dev/null 2>&1; then
  echo "check-deploy: could not install yamllint and check-jsonschema from PyPI" >&2
  exit 3
fi
"$venv/bin/check-jsonschema" --builtin-schema vendor.github-workflows "$D/github-actions-campaign.yml"
"$venv/bin/yamllint" -s -c "$D/.yamllint" "$D"/*.yml "$D"/*.yaml
echo "yamllint: ok"
"$venv/bin/python" scripts/check-deploy.py
