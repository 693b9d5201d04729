#!/usr/bin/env bash
# A real Kubernetes control plane (etcd 3.4 + kube-apiserver and kube-controller-manager 1.20.2) on
# 127.0.0.1, for the operator's tests. No Docker and no registry binaries are needed: Debian
# bookworm ships the Kubernetes 1.20.2 source, Go 1.19 and etcd, and `build` compiles from them.
#
#   scripts/k8s-control-plane.sh build   # ~5 min cold on 2 cores; a no-op when the binaries exist
#   scripts/k8s-control-plane.sh start   # ready in ~7 s; writes $K8S_RUN/kubeconfig
#   scripts/k8s-control-plane.sh stop    # stops what `start` started (by recorded PIDs)
#   scripts/k8s-control-plane.sh restart-apiserver  # kube-apiserver down and up again (same etcd)
#
# Environment: K8S_WORK (cache, default ~/.cache/k8s-control-plane), K8S_BIN (default
# $K8S_WORK/bin), K8S_RUN (state, default $K8S_WORK/run), API_PORT (16443), ETCD_PORT (23790),
# ETCD_PEER_PORT (ETCD_PORT+10), K8S_CONTROLLERS (1: also run the controller manager).
# There is no scheduler and no kubelet: pods are created but never run.
# Requests made with service-account tokens are written to $K8S_RUN/audit.log (JSON lines, Metadata
# level), so a test can see exactly which (group, resource, verb) an operator uses; the owner-reference
# admission check (blockOwnerDeletion needs `update` on the owner's finalizers) is on, as in most
# clusters; webhooks behind a Service are dialled at the Service's Endpoints (aggregator routing), so
# an Endpoints object written by hand can point a Service at a process on this machine.
set -euo pipefail
W=${K8S_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/k8s-control-plane}
BIN=${K8S_BIN:-$W/bin}
RUN=${K8S_RUN:-$W/run}
API_PORT=${API_PORT:-16443}
ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-$((ETCD_PORT + 10))}
TOKEN=flotilla-test-admin-token

build() {
  if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/etcd" ]; then
    echo "cached: $BIN"; return 0
  fi
  mkdir -p "$W"/apt/parts "$W"/apt/lists/partial "$W"/apt/cache/archives/partial "$W"/debs "$W"/root "$W"/src "$BIN"
  # A private apt configuration: the system's Debian sources plus deb-src; nothing is installed.
  sed 's/^Types: deb$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources > "$W/apt/parts/debian.sources"
  local apt=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$W/apt/parts"
             -o Dir::State::Lists="$W/apt/lists" -o Dir::Cache="$W/apt/cache" -o APT::Sandbox::User=root)
  apt-get "${apt[@]}" -qq update
  (cd "$W/debs" && apt-get "${apt[@]}" -qq download golang-1.19-go golang-1.19-src \
     golang-github-modern-go-reflect2-dev etcd-server)
  for f in "$W"/debs/*.deb; do dpkg -x "$f" "$W/root"; done
  (cd "$W/src" && apt-get "${apt[@]}" -qq source --download-only kubernetes && tar xzf kubernetes_*.orig.tar.gz)
  local k=$W/src/kubernetes-1.20.2
  # 1.20 vendors reflect2 v1.0.1, which breaks with Go >= 1.18: use Debian's v1.0.2 instead.
  local r=$k/vendor/github.com/modern-go/reflect2
  rm -f "$r"/*.go "$r"/*.s
  cp "$W"/root/usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} "$r/"
  export GOROOT=$W/root/usr/lib/go-1.19 GOPATH=$W/gopath GOCACHE=$W/gocache GOTMPDIR=$W/gotmp
  export PATH=$GOROOT/bin:$PATH CGO_ENABLED=0 GO111MODULE=off GOFLAGS= GOPROXY=off
  mkdir -p "$GOPATH/src/k8s.io" "$GOTMPDIR"
  ln -sfn "$k" "$GOPATH/src/k8s.io/kubernetes"
  cd "$GOPATH/src/k8s.io/kubernetes"  # 1.20 builds in GOPATH mode
  # pkg/generated/openapi is not in the release tarball; generate it as Makefile.generated_files does.
  go build -o "$BIN/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  local dirs
  dirs=$(find -H . \( -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) \) -type f -name '*.go' \
    | sed 's|^./staging/src|vendor|; s|^./||' \
    | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' \
    | xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' | xargs -n1 dirname | LC_ALL=C sort -u \
    | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
  "$BIN/openapi-gen" -i "$dirs" -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$W/openapi_violations.report"
  local ldf="-s -w" v
  for v in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $v.gitMajor=1 -X $v.gitMinor=20 -X $v.gitVersion=v1.20.2 -X $v.gitTreeState=clean"
    ldf="$ldf -X $v.gitCommit=faecb196815e248d3ecfb03c680a4507229c2a56 -X $v.buildDate=2021-01-13T13:20:00Z"
  done
  go build -p "$(nproc)" -tags providerless -ldflags "$ldf" -o "$BIN/kube-apiserver" ./cmd/kube-apiserver
  go build -p "$(nproc)" -tags providerless -ldflags "$ldf" -o "$BIN/kube-controller-manager" ./cmd/kube-controller-manager
  cp "$W/root/usr/bin/etcd" "$BIN/etcd"
  "$BIN/kube-apiserver" --version
}

start_apiserver() {
  "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" --insecure-port=0 \
    --cert-dir="$RUN/certs" --token-auth-file="$RUN/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$RUN/sa.pub" --service-account-signing-key-file="$RUN/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 --disable-admission-plugins=ServiceAccount \
    --enable-admission-plugins=OwnerReferencesPermissionEnforcement --enable-aggregator-routing=true \
    --audit-policy-file="$RUN/audit-policy.yaml" --audit-log-path="$RUN/audit.log" --audit-log-format=json \
    --enable-priority-and-fairness=false >> "$RUN/apiserver.log" 2>&1 &
  echo $! > "$RUN/apiserver.pid"
  local ready="curl -skf --max-time 5 -H 'Authorization: Bearer $TOKEN' https://127.0.0.1:$API_PORT/readyz"
  for _ in $(seq 1 300); do
    eval "$ready" >/dev/null && break
    kill -0 "$(cat "$RUN/apiserver.pid")" 2>/dev/null || { tail -20 "$RUN/apiserver.log" >&2; exit 1; }
    sleep 0.2
  done
  eval "$ready" >/dev/null || { echo "apiserver not ready after 60 s (see $RUN/apiserver.log)" >&2; exit 1; }
}

start() {
  for b in etcd kube-apiserver kube-controller-manager; do
    [ -x "$BIN/$b" ] || { echo "$BIN/$b is missing: run '$0 build' first" >&2; exit 1; }
  done
  mkdir -p "$RUN/certs"
  if [ ! -f "$RUN/sa.key" ]; then
    openssl genrsa -out "$RUN/sa.key" 2048 2>/dev/null
    openssl rsa -in "$RUN/sa.key" -pubout -out "$RUN/sa.pub" 2>/dev/null
  fi
  echo "$TOKEN,admin,admin,system:masters" > "$RUN/tokens.csv"
  cat > "$RUN/audit-policy.yaml" <<POLICY
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
POLICY
  "$BIN/etcd" --name flotilla-test --data-dir "$RUN/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "flotilla-test=http://127.0.0.1:$ETCD_PEER_PORT" > "$RUN/etcd.log" 2>&1 &
  echo $! > "$RUN/etcd.pid"
  cat > "$RUN/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$API_PORT", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: $TOKEN}
contexts:
- name: local
  context: {cluster: local, user: admin, namespace: default}
current-context: local
KUBECONFIG
  start_apiserver
  # Garbage collection of owned objects and Deployment -> ReplicaSet -> Pod need the controllers.
  if [ "${K8S_CONTROLLERS:-1}" = 1 ]; then
    "$BIN/kube-controller-manager" --kubeconfig="$RUN/kubeconfig" --bind-address=127.0.0.1 --secure-port=0 --port=0 \
      --controllers=garbagecollector,namespace,deployment,replicaset,serviceaccount,serviceaccount-token \
      --service-account-private-key-file="$RUN/sa.key" --root-ca-file="$RUN/certs/apiserver.crt" \
      --use-service-account-credentials=false --leader-elect=false > "$RUN/controller-manager.log" 2>&1 &
    echo $! > "$RUN/controller-manager.pid"
  fi
  echo "control plane ready; export KUBECONFIG=$RUN/kubeconfig"
}

stop() {
  local p
  for p in controller-manager apiserver etcd; do
    [ -f "$RUN/$p.pid" ] && kill "$(cat "$RUN/$p.pid")" 2>/dev/null || true
  done
  for p in controller-manager apiserver etcd; do
    if [ -f "$RUN/$p.pid" ]; then
      while kill -0 "$(cat "$RUN/$p.pid")" 2>/dev/null; do sleep 0.1; done
      rm -f "$RUN/$p.pid"
    fi
  done
}

# Kill the apiserver (SIGKILL: a crash, and no 60 s drain of open watches) and start it again on
# the same port and etcd; clients must reconnect.
restart_apiserver() {
  local pid
  pid=$(cat "$RUN/apiserver.pid")
  kill -9 "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  start_apiserver
  echo "apiserver restarted"
}

case "${1:-}" in
  build) build ;;
  start) start ;;
  stop) stop ;;
  restart-apiserver) restart_apiserver ;;
  *) echo "usage: $0 build|start|stop|restart-apiserver" >&2; exit 2 ;;
esac
