#!/usr/bin/env bash
# Installs checkov (pinned) into DIR/checkov (DIR default .cache/deploy-tools), a venv of its
# own, for tests/deploy/test_checkov.py in `make test`. A venv of its own because checkov pins
# what the dev extra pins otherwise (packaging 23.2 against constraints.txt's 26.3, among others).
# The list below is checkov's whole dependency closure, pinned (what `pip freeze` gave after
# `pip install checkov==3.3.30` with Python 3.11), installed with --no-deps: no resolver run, the
# same versions every time.
#
# Kept cheap, since it runs in a fresh clone's `make test` (beside the peers' build):
# - --no-compile: checkov's tree (boto3, botocore, ...) is ~290 MB and it imports little of it;
#   byte-compiling all of it doubled the install (29 s against 14 s here). What it imports is
#   compiled on its first run instead (a few seconds).
# - PYTHON (default python3) is the interpreter whose pip installs: from pip 22.3 on, it installs
#   into the new venv from outside (--python), so the venv gets no pip of its own. The project's
#   .venv has a recent pip (`make deploy-tools` passes it): 11-12 s here, pip's cache warm or
#   cold, against 27 s with Python 3.11's own pip 23.2.
# Does nothing when the venv's stamp (this file's sha256) matches; pip's output goes to
# DIR/checkov.install.log.
set -euo pipefail

DIR=${1:-.cache/deploy-tools}
PY=${PYTHON:-python3}
VENV=$DIR/checkov
LOG=$DIR/checkov.install.log
SELF=${BASH_SOURCE[0]}
want=$(sha256sum "$SELF" | cut -d' ' -f1)
mkdir -p "$DIR"
# one install at a time in DIR (two test sessions started together)
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DIR/.checkov.lock"
    flock 9
fi

if [ -f "$VENV/.stamp" ] && [ "$(cat "$VENV/.stamp")" = "$want" ] && [ -x "$VENV/bin/checkov" ] &&
    "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    exit 0
fi
start=$SECONDS
echo "install_checkov: checkov 3.3.30 into $VENV (10-30 s the first time; pip's output in $LOG)"
rm -rf "$VENV"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/requirements.txt" <<'REQUIREMENTS'
checkov==3.3.30
aiodns==3.6.1
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiomultiprocess==0.9.1
aiosignal==1.4.0
annotated-types==0.8.0
argcomplete==3.7.2
asteval==1.0.6
attrs==26.1.0
bc-detect-secrets==1.5.52
bc-jsonpath-ng==1.6.1
bc-python-hcl2==0.4.3
beartype==0.23.1
beautifulsoup4==4.15.0
boolean.py==5.0
boto3==1.35.49
botocore==1.35.99
cached-property==2.0.1
cachetools==5.5.2
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
click-option-group==0.5.10
cloudsplaining==0.7.0
colorama==0.4.6
ConfigArgParse==1.9.0
contextlib2==21.6.0
cyclonedx-python-lib==7.6.2
decorator==5.3.1
defusedxml==0.7.1
docker==7.2.0
dockerfile-parse==2.0.1
dpath==2.1.3
ecdsa==0.19.2
frozenlist==1.8.0
gitdb==4.0.12
GitPython==3.2.1
idna==3.20
importlib_metadata==7.2.1
Jinja2==3.1.6
jmespath==1.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
junit-xml==1.9
lark==1.3.1
license-expression==30.4.4
Markdown==3.11.3
MarkupSafe==3.0.4
multidict==7.2.1
networkx==2.6.3
numpy==2.4.6
orjson==3.13.0
packageurl-python==0.13.4
packaging==23.2
platformdirs==4.14.8
ply==3.11
policy_sentry==0.13.2
prettytable==3.18.0
propcache==0.5.4
py-serializable==1.1.2
pycares==4.11.0
pycep-parser==0.5.1
pycparser==3.12
pydantic==2.14.4
pydantic_core==2.50.5
pyparsing==3.3.3
python-dateutil==2.9.0.post0
PyYAML==6.0.4
rdflib==7.6.0
referencing==0.37.0
regex==2026.11.19
requests==2.34.2
rpds-py==2026.9.1
rustworkx==0.18.1
s3transfer==0.10.4
schema==0.7.5
semantic-version==2.10.0
six==1.17.0
smmap==5.0.3
sortedcontainers==2.4.0
soupsieve==4.1.3
spdx-tools==0.8.5
tabulate==0.9.0
termcolor==2.3.0
tqdm==4.70.1
typing-inspection==0.4.5
typing_extensions==4.16.0
unidiff==1.0.1
uritools==6.1.5
urllib3==2.8.0
wcwidth==0.9.4
xmltodict==1.0.4
yarl==1.25.1
zipp==4.1.2
REQUIREMENTS

# pip >= 22.3 (for --python) in PYTHON: install from outside into a venv without pip
pip_version=$("$PY" -m pip --version 2>/dev/null | cut -d' ' -f2 || true)
major=${pip_version%%.*}
minor=${pip_version#*.}
minor=${minor%%.*}
install=(--disable-pip-version-check --no-input install --no-deps --no-compile -r "$tmp/requirements.txt")
if [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] && ((major > 22 || (major == 22 && minor >= 3))); then
    cmd=("$PY" -m venv --without-pip "$VENV")
    pip=("$PY" -m pip --python "$VENV/bin/python")
else
    cmd=("$PY" -m venv "$VENV")
    pip=("$VENV/bin/python" -m pip)
fi
# checkov's own version module (checkov --version imports the whole tool: seconds)
check=("$VENV/bin/python" -c 'from checkov.version import version; print(version)')
if ! { "${cmd[@]}" && "${pip[@]}" "${install[@]}" && "${check[@]}"; } >"$LOG" 2>&1; then
    echo "install_checkov: FAILED after $((SECONDS - start)) s; the end of $LOG:" >&2
    tail -n 25 "$LOG" >&2
    exit 1
fi
echo "$want" >"$VENV/.stamp"
echo "install_checkov: checkov $(tail -n 1 "$LOG") ready in $((SECONDS - start)) s"
