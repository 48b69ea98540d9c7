"""Why a tool could not run, in one line that says what to do: what ``spark-state`` prints (exit code 2)
instead of a traceback.

spark_state's own errors say it already; the rest come from below it: the file system (a path that is
not there, a file where a directory should be, a permission), an object store's client (no credentials,
an endpoint out of reach; recognised by class name, so no client library is imported here), or a Spark
job (``migrate``), whose long error carries the one line that matters.
"""

from __future__ import annotations

import re

from spark_state.errors import SparkStateError

#: Credential errors of the fsspec backends' clients: botocore (s3fs), google-auth (gcsfs), azure-identity (adlfs).
CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                     "NoAuthTokenError", "DefaultCredentialsError", "RefreshError", "ClientAuthenticationError",
                     "CredentialUnavailableError"}
#: Errors of an endpoint that cannot be reached (botocore, aiohttp, the standard library).
CONNECTION_ERRORS = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError",
                     "ClientConnectorError", "ServerTimeoutError", "ConnectionError", "TimeoutError"}
#: What sets an object store's credentials, by URL scheme.
CREDENTIALS = {"s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance role)",
               "gs": "GOOGLE_APPLICATION_CREDENTIALS (or gcloud auth application-default login)",
               "abfs": "AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME and a key)"}
CREDENTIALS.update({"s3a": CREDENTIALS["s3"], "gcs": CREDENTIALS["gs"], "az": CREDENTIALS["abfs"],
                    "abfss": CREDENTIALS["abfs"]})
_SPARK_STATE_LINE = re.compile(r"spark_state: [^\n]*")
_FIX_LINE = re.compile(r"^Fix: [^\n]*", re.M)


def _names(err: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(err).__mro__}


def _from_spark(err: BaseException) -> bool:
    return type(err).__module__.split(".")[0] in ("pyspark", "py4j")


def is_object_store_error(err: BaseException) -> bool:
    """A credential or connection error of an object store's client (which location it is about is the caller's
    to say: a local path raises neither)."""
    return bool(_names(err) & (CREDENTIAL_ERRORS | CONNECTION_ERRORS))


def explain(err: Exception, location: str | None = None) -> str:
    """One line: what went wrong and what to do. `location` is the one the command was given."""
    where = f" {location}" if location else ""
    names = _names(err)
    if isinstance(err, SparkStateError):
        return str(err)
    if names & CREDENTIAL_ERRORS:
        return f"no credentials to reach{where} ({type(err).__name__}: {err}); {_credentials_fix(location)}."
    if names & CONNECTION_ERRORS:
        return (f"cannot reach the storage of{where} ({type(err).__name__}: {err}); check the network and the "
                f"endpoint (e.g. AWS_ENDPOINT_URL for an S3-compatible store).")
    if isinstance(err, OSError):
        return _file_system(err, location)
    if _from_spark(err):
        return spark_failure(err)
    return (f"unexpected {type(err).__name__}: {_reason(err)}. This is a bug in spark_state: please report it with the "
            f"output of the same command run with --traceback.")


def _credentials_fix(location: str | None) -> str:
    scheme = location.split("://", 1)[0].lower() if location and "://" in location else None
    if scheme in CREDENTIALS:
        return f"set the credentials its client reads: {CREDENTIALS[scheme]}"
    return "for an object store, set the credentials its client reads (e.g. AWS_ACCESS_KEY_ID for s3://)"


#: How long the reason of an error from below may be in the one line (a client's error can be pages long).
REASON_CHARS = 300


def _reason(text: str) -> str:
    """The first line of an error from below, cut to REASON_CHARS."""
    first = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return first if len(first) <= REASON_CHARS else first[:REASON_CHARS] + "..."


def _file_system(err: OSError, location: str | None) -> str:
    named = err.args[0] if len(err.args) == 1 and isinstance(err.args[0], str) else None
    if named is not None and ("\n" in named or " " in named.strip() and "/" not in named.split(" ", 1)[0]):
        named = None  # a message (pyarrow's HDFS client: "Unable to load libjvm\n..."), not a path
    path = err.filename or named or location
    if isinstance(err, FileNotFoundError):
        return f"{path} does not exist; check the path (a checkpoint is the query's checkpointLocation)."
    if isinstance(err, NotADirectoryError):
        return (f"{path} cannot be reached: a file is where a directory should be on its path; check the "
                f"locations given (a checkpoint is the query's checkpointLocation, a directory).")
    if isinstance(err, IsADirectoryError):
        return f"{path} is a directory where a file should be; the location is not laid out as spark_state expects."
    if isinstance(err, PermissionError):
        return (f"permission denied on {path} ({err.strerror or err}); run as a user who may read it (and write, "
                f"for commands that write), or fix its permissions; {_credentials_fix(location)}.")
    reason = _reason(err.strerror or err)
    if location and location.lower().startswith(("hdfs://", "viewfs://")) and "libjvm" in str(err):
        return (f"cannot access {path} ({reason}): fsspec reads HDFS through pyarrow, which needs a JVM and the "
                f"Hadoop client: set JAVA_HOME, HADOOP_HOME and CLASSPATH=$($HADOOP_HOME/bin/hadoop classpath --glob).")
    return f"cannot access {path}: {reason}."


def spark_failure(err: BaseException) -> str:
    """A failed Spark job's one line: the spark_state message it carries (and its fix), else its first line."""
    text = str(err)
    found = _SPARK_STATE_LINE.search(text)
    if found:
        fix = _FIX_LINE.search(text, found.end())
        line = found.group(0).strip()
        return f"{line} {fix.group(0)}" if fix and "Fix:" not in line else line
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    python_error = next((ln for ln in reversed(lines) if re.match(r"^\w+(Error|Exception): ", ln)), None)
    first = lines[0] if lines else type(err).__name__
    return f"a Spark job failed: {python_error or first}"
