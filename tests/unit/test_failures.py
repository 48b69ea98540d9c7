"""The one line ``spark-state`` prints for an error from below it (spark_state/lifecycle/failures.py)."""

from __future__ import annotations

from spark_state.lifecycle.failures import explain

#: What pyarrow's HDFS client raises when it finds no libjvm (fsspec's hdfs://): 31 KB, one dlopen line per
#: place it looked.
NO_LIBJVM = "Unable to load libjvm\n" + "\n".join(
    f"dlopen(/usr/lib/jvm/{n}/libjvm.so) failed: /usr/lib/jvm/{n}/libjvm.so: cannot open shared object file: "
    f"No such file or directory" for n in range(200))


def test_an_error_of_many_lines_from_below_is_one_short_line_naming_the_location():
    line = explain(OSError(NO_LIBJVM), "hdfs://namenode/ckpt")
    assert "\n" not in line and len(line) < 400, line
    assert "hdfs://namenode/ckpt" in line and "Unable to load libjvm" in line, line


def test_hdfs_without_a_jvm_says_what_pyarrow_needs():
    line = explain(OSError(NO_LIBJVM), "hdfs://namenode/ckpt")
    assert "JAVA_HOME" in line and "HADOOP_HOME" in line and "CLASSPATH" in line, line
    assert "(Unable to load libjvm): fsspec reads HDFS" in line, line   # not "libjvm fsspec": two sentences


def test_a_plain_path_error_still_names_its_path():
    line = explain(FileNotFoundError(2, "No such file or directory", "/data/ckpt/offsets/3"), "/data/ckpt")
    assert line.startswith("/data/ckpt/offsets/3 does not exist"), line
