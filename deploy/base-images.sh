#!/usr/bin/env bash
# Stand-in base images made from Debian packages, for a site whose Docker engine
# cannot pull from a registry (the Dockerfiles and Compose files take every base
# image as a variable, with the official images as defaults):
#
#   python  PYTHON_IMAGE  Debian bookworm's python3 (3.11) with the C headers, a
#                         venv's python/pip first on PATH as in python:3.11-slim
#   redis   REDIS_IMAGE   Debian's redis-server, protected mode off when started
#                         without a config file, as the official image's entrypoint does
#   nginx   NGINX_IMAGE   Debian's nginx, in the foreground (not made unless asked)
#
#   sudo deploy/base-images.sh                 # python and redis
#   sudo deploy/base-images.sh python redis nginx
#   eval "$(sudo deploy/base-images.sh)"       # ... and export the variables it prints
#   docker compose -f docker-compose.cpu.yml build   # (see docs/deployment.md)
#
# Everything starts from `debootstrap --variant=minbase bookworm` (root, the
# debootstrap package, a Debian mirror: DEBIAN_MIRROR) imported as $BASE_PREFIX/debian.
# The host's CA bundle goes into the images too (FUNNEL_CA_BUNDLE), so pip and
# apt work where TLS is intercepted by a proxy the host trusts.
#
# An image that already exists is kept, unless its recipe (this file) changed:
# each carries a label with this file's hash. FORCE=1 rebuilds all of them.
# Prints the variables to use them, one `export NAME=image` a line; logs on stderr.
set -euo pipefail

SUITE=${SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
BASE_PREFIX=${BASE_PREFIX:-funnel-base}
CA_BUNDLE=${FUNNEL_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
DOCKER=${DOCKER:-docker}
FORCE=${FORCE:-0}

ROOTFS_IMAGE=$BASE_PREFIX/debian:$SUITE
PYTHON_STANDIN=$BASE_PREFIX/python:3.11-$SUITE
REDIS_STANDIN=$BASE_PREFIX/redis:7-$SUITE
NGINX_STANDIN=$BASE_PREFIX/nginx:$SUITE

RECIPE=$(sha256sum "$0" | cut -c1-16)
LABEL=org.funnel.base-recipe

log() { echo "base-images: $*" >&2; }

# Up to date: the image exists and was made by this version of the script.
current() {
    [ "$FORCE" = 1 ] && return 1
    [ "$("$DOCKER" image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null)" = "$RECIPE" ]
}

# `docker build` of a Dockerfile given on stdin, in a context folder. The classic
# builder: it needs no frontend image from a registry.
build() {
    local tag=$1 context=$2 old
    old=$("$DOCKER" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
    DOCKER_BUILDKIT=0 "$DOCKER" build --network host --label "$LABEL=$RECIPE" -t "$tag" -f - "$context" \
        >"$context/build.log" 2>&1 || { tail -30 "$context/build.log" >&2; rm -rf "$context"; exit 1; }
    forget "$tag" "$old"
}

# The image a new one replaced, unless something still uses it.
forget() {
    local tag=$1 old=$2
    if [ -n "$old" ] && [ "$old" != "$("$DOCKER" image inspect --format '{{.Id}}' "$tag")" ]; then
        "$DOCKER" rmi "$old" >/dev/null 2>&1 || true
    fi
}

make_rootfs() {
    current "$ROOTFS_IMAGE" && return
    local dir old
    command -v debootstrap >/dev/null || { log "needs debootstrap (apt-get install debootstrap)"; exit 1; }
    [ "$(id -u)" = 0 ] || { log "debootstrap needs root"; exit 1; }
    dir=$(mktemp -d /tmp/funnel-rootfs.XXXXXX)
    log "debootstrap $SUITE from $DEBIAN_MIRROR (about a minute)"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
        "$SUITE" "$dir/root" "$DEBIAN_MIRROR" >"$dir/debootstrap.log" 2>&1 \
        || { tail -20 "$dir/debootstrap.log" >&2; rm -rf "$dir"; exit 1; }
    # The sources an official Debian image has: the release, its updates, security.
    cat >"$dir/root/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR $SUITE main
deb $DEBIAN_MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
    rm -rf "$dir"/root/var/cache/apt/archives/*.deb "$dir"/root/var/lib/apt/lists/*
    old=$("$DOCKER" image inspect --format '{{.Id}}' "$ROOTFS_IMAGE" 2>/dev/null || true)
    tar -C "$dir/root" --numeric-owner -c . \
        | "$DOCKER" import --change "LABEL $LABEL=$RECIPE" --change 'CMD ["bash"]' - "$ROOTFS_IMAGE" >/dev/null
    rm -rf "$dir"
    forget "$ROOTFS_IMAGE" "$old"
    log "made $ROOTFS_IMAGE"
}

# The CA bundle, in a build context of its own.
context() {
    local dir
    dir=$(mktemp -d /tmp/funnel-base.XXXXXX)
    cp "$CA_BUNDLE" "$dir/host-ca-bundle.crt"
    echo "$dir"
}

# Shared by every image: the host's CAs, kept through a later update-ca-certificates.
CA_STEPS="COPY host-ca-bundle.crt /usr/local/share/ca-certificates/host-ca-bundle.crt
RUN cp /usr/local/share/ca-certificates/host-ca-bundle.crt /etc/ssl/certs/ca-certificates.crt"

make_python() {
    current "$PYTHON_STANDIN" && return
    make_rootfs
    local dir
    dir=$(context)
    # python:3.11-slim has python, pip and the C headers on PATH in /usr/local; a venv
    # there stands in for it (Debian's python3 refuses `pip install` outside a venv).
    build "$PYTHON_STANDIN" "$dir" <<EOF
FROM $ROOTFS_IMAGE
$CA_STEPS
RUN python3 -m venv /opt/python
ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python --version && pip --version && test -e /usr/include/python3.11/Python.h
CMD ["python3"]
EOF
    rm -rf "$dir"
    log "made $PYTHON_STANDIN"
}

make_redis() {
    current "$REDIS_STANDIN" && return
    make_rootfs
    local dir
    dir=$(context)
    # The official image's entrypoint: with no config file given, protected mode
    # off (the container's network is the boundary), and runs as user redis.
    cat >"$dir/redis-entrypoint.sh" <<'EOF'
#!/bin/sh
set -e
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- redis-server "$@"
fi
if [ "$1" = redis-server ]; then
    case "$2" in
        *.conf) ;;
        *) set -- "$@" --protected-mode no ;;
    esac
fi
exec "$@"
EOF
    build "$REDIS_STANDIN" "$dir" <<EOF
FROM $ROOTFS_IMAGE
$CA_STEPS
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["redis-server"]
EOF
    rm -rf "$dir"
    log "made $REDIS_STANDIN"
}

# For a front door in front of the web tier (no Compose service uses it yet).
make_nginx() {
    current "$NGINX_STANDIN" && return
    make_rootfs
    local dir
    dir=$(context)
    build "$NGINX_STANDIN" "$dir" <<EOF
FROM $ROOTFS_IMAGE
$CA_STEPS
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx-light \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
EOF
    rm -rf "$dir"
    log "made $NGINX_STANDIN"
}

[ $# -gt 0 ] || set -- python redis
for image in "$@"; do
    case "$image" in
        python) make_python; echo "export PYTHON_IMAGE=$PYTHON_STANDIN" ;;
        redis) make_redis; echo "export REDIS_IMAGE=$REDIS_STANDIN" ;;
        nginx) make_nginx; echo "export NGINX_IMAGE=$NGINX_STANDIN" ;;
        *) log "unknown image $image (python, redis, nginx)"; exit 2 ;;
    esac
done
