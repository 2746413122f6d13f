"""The Hypothesis example database that fuzzing processes share: where a failing
program one process found is saved, and what every other process (on this host or
another) tries first.

`--database` is a folder (Hypothesis's DirectoryBasedExampleDatabase; the default
is one under `--out`) or `redis://HOST:PORT/N` (its RedisExampleDatabase, with the
`redis` client of the `fleet` extra). A read-only run (pull requests) reads it
through ReadOnlyDatabase, multiplexed with the folder under `--out`, so its own
findings are still kept locally.

Hypothesis keys entries by the test, which for the lockstep machine is the same in
every process and on every host running the same blocktable. Entries are also kept
apart by kernel and device (a namespace: a sub-folder, or a Redis key prefix): a
program that fails one kernel is not one another kernel must pass, and Hypothesis
deletes an entry that no longer fails where it is replayed, so an interpreter run
must not clear a failure that only the compiled kernel shows.

The password may be in the URL or, where the URL has none, in the environment
(`REDIS_PASSWORD`); either way no message shows it (cases/credentials.py).

Case files stay the durable record: database entries are Hypothesis's choice
sequences, readable only by the version of the harness that wrote them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, MultiplexedDatabase, ReadOnlyDatabase

from blocktable.plugin import KernelSpec, PluginError
from blocktable.properties.cases.credentials import masked

DEFAULT_FOLDER = "hypothesis-db"  # under --out
REDIS_SCHEMES = ("redis", "rediss")
REDIS_PREFIX = "blocktable"
CONNECT_TIMEOUT_S = 5.0
PASSWORD_VARIABLE = "REDIS_PASSWORD"  # the password, where the URL has none


def is_redis(spec: str) -> bool:
    return urlsplit(spec).scheme in REDIS_SCHEMES


def check(spec: str) -> str:
    """`spec` as given to --database, checked without reaching any server: a folder
    path, or redis://[:PASSWORD@]HOST[:PORT][/N]. ValueError names what is wrong."""
    if not spec:
        raise ValueError("--database is empty: give a folder or redis://HOST:PORT/N")
    if "://" not in spec:
        return spec
    parts = urlsplit(spec)
    shown = masked(spec)  # what messages show: never the password
    if parts.scheme not in REDIS_SCHEMES:
        raise ValueError(f"--database {shown}: unsupported scheme {parts.scheme!r} (a folder, or redis://HOST:PORT/N)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"--database {shown}: the port must be a number from 1 to 65535") from None
    if port == 0:
        raise ValueError(f"--database {shown}: the port must be a number from 1 to 65535")
    if not parts.hostname:
        raise ValueError(f"--database {shown}: no host (redis://HOST:PORT/N)")
    if parts.path not in ("", "/") and not re.fullmatch(r"/\d+", parts.path):
        raise ValueError(f"--database {shown}: the database number after the port must be a whole number "
                         f"(redis://HOST:PORT/N), got {parts.path[1:]!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"--database {shown}: unexpected ?query or #fragment")
    return spec


def password(spec: str) -> str | None:
    """The password the client sends: the URL's, else the environment's."""
    return urlsplit(spec).password or os.environ.get(PASSWORD_VARIABLE) or None


def redis_client(spec: str):  # -> redis.Redis
    """A client for a checked redis:// URL; ValueError if the client is not installed."""
    try:
        import redis
    except ImportError:
        raise ValueError(f"--database {masked(spec)}: the redis client is not installed "
                         f"(pip install 'blocktable[fleet]')") from None
    # The URL's password, where it has one, overrides this keyword.
    return redis.Redis.from_url(spec, socket_connect_timeout=CONNECT_TIMEOUT_S, password=password(spec))


def check_reachable(spec: str) -> None:
    """Before any worker starts: a Redis server that does not answer is a
    configuration error, not a finding about the kernel."""
    if not is_redis(spec):
        return
    client = redis_client(spec)
    try:
        client.ping()
    except Exception as e:  # noqa: BLE001 - the client's errors vary by version; all mean "not usable"
        raise ValueError(f"--database {masked(spec)}: cannot reach the Redis server: "
                         f"{masked(str(e), [password(spec)])}") from None
    finally:
        client.close()


def namespace(kernel: str, device: str) -> str:
    """Which kernel on which device the entries are for, the same on every host: a
    file plug-in by its file's name and function (checkouts differ in their paths)."""
    try:
        kernel = KernelSpec.parse(kernel).short
    except PluginError:
        pass  # named as given: the child reports the bad spec
    return f"{kernel}@{device}"


def _folder_name(space: str) -> str:
    return re.sub(r"[^\w.@-]+", "_", space)


def _open(spec: str, space: str) -> ExampleDatabase:
    if is_redis(spec):
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis_client(spec), key_prefix=f"{REDIS_PREFIX}:{space}:".encode())
    return DirectoryBasedExampleDatabase(Path(spec) / _folder_name(space))


def open_database(spec: str, space: str, readonly: bool = False, local: str | None = None) -> ExampleDatabase:
    """The database a fuzzing process uses. Read-only: `spec` is only read, and
    `local` (a folder), when given, keeps this run's own findings."""
    database = _open(spec, space)
    if not readonly:
        return database
    if local is None:
        return ReadOnlyDatabase(database)
    return MultiplexedDatabase(_open(local, space), ReadOnlyDatabase(database))
