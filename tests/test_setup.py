"""Set-up failures stop with one sentence saying what to install, not a JVM stack trace."""

import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.runtime import SparkSetupError, delta_jars

ROOT = Path(__file__).resolve().parent.parent


def run_setup(tmp_path, java_script):
    """setup.sh with a PATH holding only the few tools it uses before Java is checked, and `java`
    when given: the machine's own Java is out of sight."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "sed", "head", "cut"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if java_script is not None:
        java = bin_dir / "java"
        java.write_text(java_script)
        java.chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    return subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True,
                          env=env, timeout=60)


def test_setup_without_java_says_what_to_install(tmp_path):
    result = run_setup(tmp_path, None)
    assert result.returncode == 1
    assert "Install a Java 17 JDK" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def fake_java(version, first_line=""):
    first = f"echo '{first_line}' >&2\n" if first_line else ""
    return f'#!{shutil.which("sh")}\n{first}echo \'openjdk version "{version}" 2025-07-15\' >&2\n'


@pytest.mark.parametrize("version", ["11.0.2", "25.0.2", "26"])
def test_setup_with_a_java_spark_does_not_run_here_says_what_to_install(tmp_path, version):
    result = run_setup(tmp_path, fake_java(version))
    assert result.returncode == 1
    assert f"Java {version} found" in result.stderr and "runs on Java 17, 21 or 25 (from 25.0.3)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Exception" not in result.stderr


@pytest.mark.parametrize("version", ["17.0.15", "21.0.13", "25.0.3", "25.0.10"])
@pytest.mark.parametrize("first_line", ["", "Picked up JAVA_TOOL_OPTIONS: -Xlog:gc"])
def test_setup_takes_java_17_21_and_25_from_its_third_update(tmp_path, version, first_line):
    result = run_setup(tmp_path, fake_java(version, first_line))
    assert "Java" not in result.stderr  # past the check (it stops later: this PATH has no python3)
    assert result.returncode != 0


def test_spark_starts_on_java_17_21_and_25_names_any_other_and_keeps_an_archive_per_java(tmp_path, monkeypatch):
    from pipeline.runtime import session

    def java_home(version, first_line=""):
        home = tmp_path / f"{version}{len(first_line)}"
        (home / "bin").mkdir(parents=True, exist_ok=True)
        java = home / "bin" / "java"
        java.write_text(fake_java(version, first_line))
        java.chmod(0o755)
        return str(home)

    for version, release in (("17.0.15", 17), ("21.0.8", 21), ("25.0.3", 25)):
        monkeypatch.setenv("JAVA_HOME", java_home(version))
        session._check_java()
        assert session.jvm_archive().name.endswith(f"-java{release}.jsa")
    # with JAVA_TOOL_OPTIONS set the JVM names them first: the version is read from its own line
    monkeypatch.setenv("JAVA_HOME", java_home("21.0.8", "Picked up JAVA_TOOL_OPTIONS: -Xlog:gc"))
    session._check_java()
    for version in ("25.0.2", "11.0.2", "26.0.1"):
        monkeypatch.setenv("JAVA_HOME", java_home(version))
        with pytest.raises(SparkSetupError, match=rf'Java 17, 21 or 25 \(from 25\.0\.3\); found: openjdk version "{version}"'):
            session._check_java()
    assert session.jvm_archive().name.endswith("-java26.jsa")  # (an archive serves the JVM that made it)


def test_the_java_version_is_read_from_its_line_whatever_the_jvm_prints_first():
    from pipeline.runtime.session import java_accepted, parse_java_version
    assert parse_java_version('openjdk version "17" 2021-09-14\nOpenJDK Runtime Environment') == \
        (17, 0, 'openjdk version "17" 2021-09-14')
    assert parse_java_version('openjdk version "25.0.3" 2026-04-21 LTS')[:2] == (25, 3)
    # JAVA_TOOL_OPTIONS set (a profiler, a class-loading log): the JVM says so first
    picked = 'Picked up JAVA_TOOL_OPTIONS: -Xlog:class+load=info:file=/tmp/c-%p.log\nopenjdk version "21.0.8" 2025-07-15\n'
    assert parse_java_version(picked) == (21, 8, 'openjdk version "21.0.8" 2025-07-15')
    assert parse_java_version('java version "1.8.0_451"')[:2] == (1, 0)
    assert parse_java_version("") == (None, 0, "unknown")
    assert parse_java_version("Error: could not open lib/jvm.cfg") == (None, 0, "Error: could not open lib/jvm.cfg")
    accepted = [(17, 0), (17, 15), (21, 8), (25, 3), (25, 10)]
    refused = [(25, 2), (25, 0), (26, 1), (1, 0), (11, 2), (None, 0)]
    assert all(java_accepted(*v) for v in accepted) and not any(java_accepted(*v) for v in refused)


def test_missing_delta_jars_name_the_fix(tmp_path, monkeypatch):
    with pytest.raises(SparkSetupError, match="run 'make setup'"):
        delta_jars(tmp_path, fetch=False)
    monkeypatch.setenv("REPLOG_MAVEN", "http://127.0.0.1:9/maven2")  # nothing listens there
    with pytest.raises(SparkSetupError, match="could not be fetched from Maven Central"):
        delta_jars(tmp_path / "empty")
    assert not list((tmp_path / "empty").glob("*.jar"))  # nothing partial left


def test_the_cache_is_the_users_unless_a_checkout_or_replog_cache_says_otherwise(tmp_path, monkeypatch):
    from pipeline.runtime import cache
    monkeypatch.setenv("REPLOG_CACHE", str(tmp_path / "mine"))
    assert cache.jars_dir() == tmp_path / "mine" / "jars"
    monkeypatch.delenv("REPLOG_CACHE")
    assert cache.cache_dir() == cache.CHECKOUT_CACHE  # this checkout's make setup fetched the jars here
    monkeypatch.setattr(cache, "CHECKOUT_CACHE", tmp_path / "installed" / ".cache")  # an installed package
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "replog"


def test_cached_jars_are_found():
    names = " ".join(Path(j).name for j in delta_jars())
    assert "delta-spark_4.2_2.13" in names and "delta-storage" in names


def test_a_root_given_as_a_uri_goes_through_hadoops_filesystem(spark, tmp_path):
    from pipeline import Cluster
    from pipeline.errors import ReplogError
    from pipeline.storage import Storage

    root = f"file://{tmp_path}/uri-root/"
    storage = Storage(spark, root)
    # spelled as Hadoop and Delta qualify it (file:///x is file:/x), so table locations match
    assert (storage.uri, storage.path("partitions"), storage.log_path(2)) == (
        True, f"file:{tmp_path}/uri-root/cluster/partitions", f"file:{tmp_path}/uri-root/brokers/2/log")
    with pytest.raises(ReplogError, match="CLUSTER_NOT_FOUND"):
        Cluster.open(spark, root)
    Cluster.create(spark, root, brokers=2).create_topic("t", partitions=2, replication_factor=2)
    assert (tmp_path / "uri-root" / "brokers" / "1" / "log" / "_delta_log").is_dir()
    opened = Cluster.open(spark, root)
    assert sorted((r["partition"], r["leader"]) for r in opened.describe("t").collect()) == [(0, 0), (1, 1)]


def test_spark_submit_runs_rounds_with_the_settings_local_runs_get():
    """Under spark-submit the JVM starts from conf/spark-defaults.conf before get_spark() runs, so
    its static settings (the file system, driver memory) must be there: each round setting of
    FAST_CONFS, except the UI (an operator's job keeps its UI), with the same value."""
    from pipeline.runtime import FAST_CONFS
    conf = {}
    for line in (Path(__file__).resolve().parent.parent / "conf" / "spark-defaults.conf").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split(None, 1)
            conf[key] = value.strip()
    wanted = {k: v for k, v in FAST_CONFS.items() if not k.startswith("spark.ui.enabled")}
    assert {k: conf.get(k) for k in wanted} == wanted
