"""The daemon's configuration: TOML file, FSPROBE_* environment and flags, and its refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsprobe.daemon.config import (
    DEFAULT_LISTEN,
    ConfigError,
    Overrides,
    load,
    locate,
    parse_listen,
    quota_probes_enabled,
)

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fsprobe.toml"
    path.write_text(text)
    return str(path)


def refused(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(Overrides(config_file=write(tmp_path, text)), environ={})
    return caught.value


def test_a_path_alone_needs_no_file(tmp_path):
    config = load(Overrides(paths=(str(tmp_path),)), environ={})
    (target,) = config.targets
    assert target.path == str(tmp_path)
    assert target.intervals == {
        "statvfs": 15.0,
        "write": 60.0,
        "quota": 300.0,
        "lfs_df": 3600.0,
        "imports": 15.0,
        "tmpdir": 60.0,
    }
    assert target.redirect_interval == 60.0  # the daemon's tasks, not a probe: never judged
    assert target.settings.deadline == 10.0
    assert target.settings.write_bytes == 1024 * 1024
    assert target.settings.policy.intervals == target.intervals
    # lfs answers (quota, lfs df, the layout and its pools) are renewed once per quota round
    assert target.settings.server_probes.cache_seconds == 0.8 * 300.0
    assert config.listen == DEFAULT_LISTEN
    assert config.state_dir == os.path.join("/tmp", f"fsprobe-{os.getuid()}")
    assert config.textfile_dir is None and config.web_config is None


def test_no_target_at_all_is_a_usage_error():
    with pytest.raises(ConfigError, match="no target to watch: give a directory"):
        load(Overrides(), environ={})


def test_defaults_and_per_target_overrides(tmp_path):
    config = load(
        Overrides(
            config_file=write(
                tmp_path,
                """
listen = "[::1]:9100"
textfile_dir = "prom"
log_level = "warning"
sync_redirected = true

[defaults]
statvfs_interval = 5
write_interval = 30.5
deadline = 4
quota_timeout = 20
write_bytes = "256K"
quota_provider = "lfs"
lfs = "/opt/lustre/bin/lfs"

[defaults.thresholds]
headroom_degraded_ratio = 0.2
write_slow_seconds = 2

[[targets]]
path = "ckpt"
fallback_dirs = ["/scratch/fallback"]
project = 4242

[[targets]]
path = "/abs/other"
write_probe = false
write_interval = 120
quota_probe = "never"
user = 1000
group = 2000
  [targets.thresholds]
  headroom_degraded_ratio = 0.3
  check_tmpdir = false
""",
            )
        ),
        environ={},
    )
    first, second = config.targets
    assert first.path == str(tmp_path / "ckpt")  # relative to the file, not the cwd
    assert first.intervals["statvfs"] == 5.0 and first.intervals["write"] == 30.5
    assert first.intervals["quota"] == 300.0
    assert first.settings.deadline == 4.0 and first.settings.write_bytes == 256 * 1024
    assert first.settings.server_probes.provider == "lfs"
    assert first.settings.server_probes.lfs == "/opt/lustre/bin/lfs"
    assert first.settings.server_probes.timeout == 20.0
    assert (
        first.settings.server_probes.project == 4242 and first.settings.server_probes.user is None
    )
    assert first.fallback_dirs == ("/scratch/fallback",)
    assert first.settings.policy.headroom_degraded_ratio == 0.2
    assert first.settings.policy.write_slow_seconds == 2.0
    assert first.quota_enabled

    assert second.path == "/abs/other"
    assert second.settings.write_probe is False
    assert second.intervals["write"] == 120.0 and second.intervals["statvfs"] == 5.0
    assert second.settings.policy.headroom_degraded_ratio == 0.3
    assert second.settings.policy.write_slow_seconds == 2.0  # the default still applies
    assert second.settings.policy.check_tmpdir is False
    assert (second.settings.server_probes.user, second.settings.server_probes.group) == (1000, 2000)
    assert second.server_probes_elsewhere == 'quota_probe = "never"'
    assert not second.quota_enabled

    assert config.listen == "[::1]:9100" and config.listen_address == ("::1", 9100)
    assert config.textfile_dir == str(tmp_path / "prom")
    assert config.log_level == "warning" and config.sync_redirected is True


def test_environment_overrides_the_file_and_flags_override_the_environment(tmp_path):
    file = write(
        tmp_path,
        'listen = "127.0.0.1:1111"\nstate_dir = "/from/file"\n'
        '[defaults]\nlfs = "/file/lfs"\n[[targets]]\npath = "/t"\n',
    )
    environ = {
        "FSPROBE_CONFIG": file,
        "FSPROBE_LISTEN": "127.0.0.1:2222",
        "FSPROBE_STATE_DIR": "/from/env",
        "FSPROBE_TEXTFILE_DIR": "/env/textfile",
        "FSPROBE_WEB_CONFIG": "/env/web.yml",
        "FSPROBE_LFS": "/env/lfs",
    }
    from_env = load(Overrides(), environ=environ)
    assert from_env.source == file
    assert from_env.listen == "127.0.0.1:2222"
    assert from_env.state_dir == "/from/env"
    assert from_env.textfile_dir == "/env/textfile"
    assert from_env.web_config == "/env/web.yml"
    assert from_env.targets[0].settings.server_probes.lfs == "/env/lfs"

    from_flags = load(
        Overrides(listen="127.0.0.1:3333", state_dir="/from/flag", lfs="/flag/lfs"),
        environ=environ,
    )
    assert from_flags.listen == "127.0.0.1:3333"
    assert from_flags.state_dir == "/from/flag"
    assert from_flags.targets[0].settings.server_probes.lfs == "/flag/lfs"

    from_file = load(Overrides(config_file=file), environ={})
    assert from_file.listen == "127.0.0.1:1111" and from_file.state_dir == "/from/file"
    assert from_file.targets[0].settings.server_probes.lfs == "/file/lfs"


def test_command_line_paths_join_the_file_targets_and_keep_their_overrides(tmp_path):
    file = write(tmp_path, '[[targets]]\npath = "/a"\nwrite_interval = 7\n')
    config = load(Overrides(config_file=file, paths=("/a", "/b")), environ={})
    assert [target.path for target in config.targets] == ["/a", "/b"]
    assert config.targets[0].intervals["write"] == 7.0
    assert config.targets[1].intervals["write"] == 60.0


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, True),
        ({"SLURM_LOCALID": "0"}, True),
        ({"SLURM_LOCALID": "3"}, False),
        ({"LOCAL_RANK": "0"}, True),
        ({"LOCAL_RANK": "1"}, False),
        ({"SLURM_LOCALID": "0", "LOCAL_RANK": "2"}, True),  # Slurm's word comes first
    ],
)
def test_quota_probe_auto_runs_on_local_rank_zero_only(environ, expected):
    assert quota_probes_enabled("auto", environ) is expected
    assert quota_probes_enabled("always", environ) is True
    assert quota_probes_enabled("never", environ) is False


def test_quota_probe_auto_is_resolved_from_the_environment(tmp_path):
    config = load(Overrides(paths=(str(tmp_path),)), environ={"LOCAL_RANK": "5"})
    elsewhere = config.targets[0].server_probes_elsewhere
    assert elsewhere == "local rank 0 of this node asks lfs quota and lfs df for this job " + (
        "(LOCAL_RANK=5 here)"
    )
    assert not config.targets[0].quota_enabled


def test_syntax_error_names_file_and_line(tmp_path):
    error = refused(tmp_path, "[defaults]\nstatvfs_interval = 5\nwrite_interval = = 3\n")
    assert error.file.endswith("fsprobe.toml") and error.line == 3
    assert str(error).startswith(f"{error.file}:3: not valid TOML")


def test_unknown_key_names_file_line_and_key(tmp_path):
    error = refused(
        tmp_path, '[[targets]]\npath = "/a"\n\n[[targets]]\npath = "/b"\nwrite_intervall = 5\n'
    )
    assert (error.line, error.key) == (6, "targets[1].write_intervall")
    assert "unknown key" in error.reason and "write_interval" in error.reason
    assert str(error).startswith(f"{error.file}:6: targets[1].write_intervall: unknown key")


@pytest.mark.parametrize(
    ("text", "line", "key", "reason"),
    [
        (
            '[[targets]]\npath = "/a"\nwrite_interval = "5s"\n',
            3,
            "targets[0].write_interval",
            "expected a number",
        ),
        (
            '[[targets]]\npath = "/a"\nwrite_interval = 0\n',
            3,
            "targets[0].write_interval",
            "seconds from 0.1 to 604800, got 0",
        ),
        (
            '[defaults]\nwrite_bytes = "lots"\n[[targets]]\npath = "/a"\n',
            2,
            "defaults.write_bytes",
            "not a size",
        ),
        (
            '[defaults]\nwrite_probe = "yes"\n[[targets]]\npath = "/a"\n',
            2,
            "defaults.write_probe",
            "true or false",
        ),
        (
            '[defaults]\nquota_probe = "sometimes"\n[[targets]]\npath = "/a"\n',
            2,
            "defaults.quota_probe",
            "auto, always, never",
        ),
        ('listen = "localhost"\n[[targets]]\npath = "/a"\n', 1, "listen", "not a listen address"),
        (
            '[defaults.thresholds]\nheadroom_degraded_ratio = 10\n[[targets]]\npath = "/a"\n',
            2,
            "defaults.thresholds.headroom_degraded_ratio",
            "ratio from 0 to 1 (0.1 is 10 %), got 10",
        ),
        (
            '[defaults.thresholds]\nheadroom_unhealthy_ratio = 0.5\n[[targets]]\npath = "/a"\n',
            2,
            "defaults.thresholds.headroom_unhealthy_ratio",
            "must not exceed headroom_degraded",
        ),
        (
            '[[targets]]\npath = "/a"\n[[targets]]\npath = "/a/"\n',
            4,
            "targets[1].path",
            "already targets[0]",
        ),
        ("[[targets]]\nwrite_interval = 5\n", 1, "targets[0]", "a target needs a path"),
        (
            '[[targets]]\npath = "/a"\nuser = -1\n',
            3,
            "targets[0].user",
            "numeric ID from 0 to 4294967294",
        ),
        (
            '[[targets]]\npath = "/a"\n[targets.thresholds]\nwrite_slow_secs = 1\n',
            4,
            "targets[0].thresholds.write_slow_secs",
            "unknown key",
        ),
        (
            '[[targets]]\npath = "/a"\nthresholds.transient_write_window = 0\n',
            3,
            "targets[0].thresholds.transient_write_window",
            "whole number from 1 to 100",
        ),
        ('targets = "/a"\n', 1, "targets", "array of tables"),
    ],
)
def test_semantic_errors_name_line_key_and_reason(tmp_path, text, line, key, reason):
    error = refused(tmp_path, text)
    assert (error.line, error.key) == (line, key)
    assert reason in error.reason


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load(Overrides(config_file=str(tmp_path / "nope.toml")), environ={})


def test_bad_environment_value_names_the_variable(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load(Overrides(paths=(str(tmp_path),)), environ={"FSPROBE_LISTEN": "9731"})
    assert caught.value.key == "FSPROBE_LISTEN"


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:9731", ("127.0.0.1", 9731)),
        ("[::1]:9731", ("::1", 9731)),
        (":9100", ("0.0.0.0", 9100)),
        ("node1.example:0", ("node1.example", 0)),
    ],
)
def test_listen_addresses(text, address):
    assert parse_listen(text) == address


@pytest.mark.parametrize("text", ["9731", "::1:9731", "host:99999", "host:", "[::1]"])
def test_bad_listen_addresses(text):
    with pytest.raises(ValueError, match="not a listen address"):
        parse_listen(text)


def test_locate_finds_keys_in_tables_arrays_and_dotted_keys():
    text = (
        "listen = ':1'\n"
        "[defaults]\n"
        "deadline = 3\n"
        "[defaults.thresholds]\n"
        "check_tmpdir = true\n"
        "[[targets]]\n"
        "path = '/a'\n"
        "[[targets]]\n"
        "path = '/b'\n"
        "thresholds.write_slow_seconds = 1\n"
    )
    assert locate(text, ("listen",)) == 1
    assert locate(text, ("defaults", "deadline")) == 3
    assert locate(text, ("defaults", "thresholds", "check_tmpdir")) == 5
    assert locate(text, ("targets", 1, "path")) == 9
    assert locate(text, ("targets", 1, "thresholds", "write_slow_seconds")) == 10
    assert locate(text, ("targets", 2, "path")) is None


def test_the_shipped_systemd_example_is_accepted():
    example = REPO / "deploy" / "systemd" / "fsprobe.toml"
    config = load(Overrides(config_file=str(example)), environ={})
    assert len(config.targets) >= 1
    assert all(target.quota_enabled for target in config.targets)


def test_fallback_dirs_come_from_the_target_and_the_environment(tmp_path):
    config = load(
        Overrides(
            config_file=write(
                tmp_path, f'[[targets]]\npath = "{tmp_path}"\nfallback_dirs = ["/scratch/a"]\n'
            ),
            sync_redirected=True,
        ),
        environ={"FSPROBE_FALLBACK_DIRS": "/scratch/b:/scratch/a"},
    )
    (target,) = config.targets
    assert target.fallback_dirs == ("/scratch/a", "/scratch/b")
    assert target.sync_redirected and config.sync_redirected


def test_the_redirect_interval_times_the_tasks_and_is_not_a_probe_interval(tmp_path):
    config = load(
        Overrides(
            config_file=write(
                tmp_path, f'[[targets]]\npath = "{tmp_path}"\nredirect_interval = 5\n'
            )
        ),
        environ={},
    )
    (target,) = config.targets
    assert target.redirect_interval == 5.0
    assert "redirect" not in target.intervals
    assert "redirect" not in target.settings.policy.intervals
    error = refused(tmp_path, f'[[targets]]\npath = "{tmp_path}"\nredirect_interval = 0\n')
    assert error.key == "targets[0].redirect_interval"


def test_the_documented_example_loads_as_written():
    example = Path(__file__).resolve().parents[2] / "docs" / "fsprobe.example.toml"
    config = load(Overrides(config_file=str(example)), environ={})
    llm, home = config.targets
    assert llm.settings.server_probes.project == 4242
    assert llm.fallback_dirs == ("/lustre/work/proj/llm/fallback",)
    assert home.settings.write_probe is False
    assert home.intervals["statvfs"] == 30
    assert home.settings.policy.headroom_degraded_ratio == 0.20


def test_relative_paths_in_the_file_are_relative_to_the_file(tmp_path):
    written = write(tmp_path, '[[targets]]\npath = "ckpt"\nfallback_dirs = ["../fallback"]\n')
    (target,) = load(Overrides(config_file=written), environ={}).targets
    assert target.path == str(tmp_path / "ckpt")
    assert target.fallback_dirs == (str(tmp_path.parent / "fallback"),)


@pytest.mark.parametrize(
    ("line", "key", "reason"),
    [
        ("deadline = inf", "defaults.deadline", "seconds from 0.1 to 3600, got inf"),
        ("deadline = -inf", "defaults.deadline", "seconds from 0.1 to 3600, got -inf"),
        ("statvfs_interval = nan", "defaults.statvfs_interval", "to 604800, got nan"),
        ("quota_timeout = 1e9", "defaults.quota_timeout", "from 0.1 to 3600, got 1000000000.0"),
        (
            "write_interval = 9223372036854775807",
            "defaults.write_interval",
            "to 604800, got 9223372036854775807",
        ),
        ('write_bytes = "8G"', "defaults.write_bytes", "at most 64M"),
        ("write_bytes = 9223372036854775807", "defaults.write_bytes", "at most 64M"),
        (
            "thresholds.stale_after_intervals = nan",
            "defaults.thresholds.stale_after_intervals",
            "a number above 0 and at most 1000, got nan",
        ),
        (
            "thresholds.stale_after_intervals = 1e300",
            "defaults.thresholds.stale_after_intervals",
            "at most 1000",
        ),
        (
            "thresholds.grace_expiring_seconds = inf",
            "defaults.thresholds.grace_expiring_seconds",
            "seconds from 0 to 31622400, got inf",
        ),
        (
            "thresholds.write_slow_seconds = nan",
            "defaults.thresholds.write_slow_seconds",
            "seconds from 0 to 86400, got nan",
        ),
        (
            "thresholds.headroom_degraded_ratio = nan",
            "defaults.thresholds.headroom_degraded_ratio",
            "a ratio from 0 to 1 (0.1 is 10 %), got nan",
        ),
        (
            "thresholds.transient_write_window = 1000000000",
            "defaults.thresholds.transient_write_window",
            "from 1 to 100",
        ),
        ("project = 4294967295", "defaults.project", "numeric ID from 0 to 4294967294"),
        ('lfs = "/usr/bin/lfs\\u0000x"', "defaults.lfs", "non-empty string"),
    ],
)
def test_non_finite_and_oversized_values_are_refused_with_file_and_line(
    tmp_path, line, key, reason
):
    if line.startswith(("project", "user", "group")):
        text = f'[[targets]]\npath = "/a"\n{line}\n'
        key = key.replace("defaults", "targets[0]")
        expected_line = 3
    else:
        text = f'[defaults]\n{line}\n[[targets]]\npath = "/a"\n'
        expected_line = 2
    error = refused(tmp_path, text)
    assert (error.line, error.key) == (expected_line, key)
    assert reason in error.reason
    assert str(error).startswith(f"{error.file}:{expected_line}: {key}: ")


def test_the_largest_accepted_values_load(tmp_path):
    config = load(
        Overrides(
            config_file=write(
                tmp_path,
                '[defaults]\ndeadline = 3600\nwrite_bytes = "64M"\nquota_interval = 604800\n'
                '[[targets]]\npath = "/a"\nproject = 4294967294\n',
            )
        ),
        environ={},
    )
    (target,) = config.targets
    assert target.settings.deadline == 3600.0
    assert target.settings.write_bytes == 64 * 1024 * 1024
    assert target.intervals["quota"] == 604800.0
    assert target.settings.server_probes.project == 4294967294


def test_a_fifo_or_a_huge_file_is_not_read_as_config(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load(Overrides(config_file=str(fifo)), environ={})  # returns: nothing waits on a writer
    huge = tmp_path / "huge.toml"
    huge.write_text("# padding\n" * 200_000)
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load(Overrides(config_file=str(huge)), environ={})


def test_run_once_with_an_infinite_deadline_is_a_usage_error_not_a_crash(tmp_path):
    config = write(tmp_path, f'[defaults]\ndeadline = inf\n[[targets]]\npath = "{tmp_path}"\n')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsprobe",
            "run",
            "--once",
            "--config",
            config,
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 64, result.stderr
    assert (
        f"{config}:2: defaults.deadline: expected a number of seconds from 0.1 to 3600, got inf"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_user_and_group_may_be_names(tmp_path):
    config = load(
        Overrides(
            config_file=write(tmp_path, '[[targets]]\npath = "/a"\nuser = "root"\ngroup = "root"\n')
        ),
        environ={},
    )
    assert (
        config.targets[0].settings.server_probes.user,
        config.targets[0].settings.server_probes.group,
    ) == (0, 0)
    error = refused(tmp_path, '[[targets]]\npath = "/a"\nuser = "no-such-user-harden"\n')
    assert (error.line, error.key) == (3, "targets[0].user")
    assert "no user named 'no-such-user-harden'" in error.reason
    error = refused(tmp_path, '[[targets]]\npath = "/a"\nproject = "alice"\n')
    assert "a numeric ID" in error.reason
