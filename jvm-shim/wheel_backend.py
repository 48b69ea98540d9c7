"""PEP 517 backend: setuptools, plus pyspark in the environment of wheel builds only.

A wheel carries the shim jar, compiled (setup.py) against this pyspark's jars; editable
installs and sdists compile nothing, so they do not pay for installing pyspark.
"""

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - the rest of the PEP 517 hooks, unchanged

#: Spark the wheel's jar is compiled against: the newest supported one (the jar links on 4.0-4.3).
BUILD_PYSPARK = "pyspark==4.3.0"


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + [BUILD_PYSPARK]
