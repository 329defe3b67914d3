"""Where the Delta Lake jars and the driver JVM's class-data-sharing archive live, and fetching
the jars into it.

The cache is, in order: `$REPLOG_CACHE` when set; the checkout's `.cache` when this package runs
from a source checkout whose `make setup` fetched the jars there; else the user's cache,
`$XDG_CACHE_HOME/replog` (`~/.cache/replog`). An installed package (`pip install .`) so keeps
nothing beside its source, and the first Spark session it starts fetches the two jars from Maven
Central into the user's cache, checked against their SHA-1, once."""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

__all__ = ["cache_dir", "jars_dir", "fetch_delta_jars", "DELTA_VERSION", "DELTA_ARTIFACTS", "MAVEN"]

# delta-spark 4.4.1 (Python) supports Spark 4.2 with Scala 2.13; Maven Central's newest
# io.delta:delta-spark_4.2_2.13 is 4.4.0 (scripts/setup.sh fetches the same)
DELTA_VERSION = "4.4.0"
DELTA_ARTIFACTS = ("delta-spark_4.2_2.13", "delta-storage")
MAVEN = "https://repo1.maven.org/maven2"  # $REPLOG_MAVEN: a mirror
CHECKOUT_CACHE = Path(__file__).resolve().parents[2] / ".cache"


def cache_dir() -> Path:
    given = os.environ.get("REPLOG_CACHE")
    if given:
        return Path(given).expanduser()
    if any((CHECKOUT_CACHE / "jars").glob("delta-spark*.jar")):
        return CHECKOUT_CACHE
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "replog"


def jars_dir() -> Path:
    return cache_dir() / "jars"


def fetch_delta_jars(dest: Path | None = None) -> list[Path]:
    """Downloads the Delta jars missing from `dest` (default: the cache's jars) from Maven
    Central, each checked against Maven's SHA-1; the jars' paths. OSError when one cannot be
    fetched or does not match (nothing partial is left behind)."""
    dest = dest or jars_dir()
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for artifact in DELTA_ARTIFACTS:
        path = dest / f"{artifact}-{DELTA_VERSION}.jar"
        if not path.is_file() or path.stat().st_size == 0:
            url = f"{os.environ.get('REPLOG_MAVEN', MAVEN)}/io/delta/{artifact}/{DELTA_VERSION}/{artifact}-{DELTA_VERSION}.jar"
            with urllib.request.urlopen(url, timeout=120) as response:
                body = response.read()
            with urllib.request.urlopen(url + ".sha1", timeout=60) as response:
                expected = response.read().decode().split()[0].strip()
            if hashlib.sha1(body).hexdigest() != expected:
                raise OSError(f"{url}: checksum mismatch (expected SHA-1 {expected})")
            part = path.with_suffix(".part")
            part.write_bytes(body)
            part.replace(path)
        paths.append(path)
    return paths
