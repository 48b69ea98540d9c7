"""Helpers of the tests, one module per idea; test modules import from here, never from each other.

changes          changes tables as the shim sends them, and the dicts tests compare them with
stores           a store on a temp root with test settings; the store of a real query's checkpoint
dictionary_rows  typed rows with repeated strings (dictionary tests, the format-2 fixture)
paths            the checkout, its conf/ and fixtures/
waiting          bounded polling
processes        /proc: the driver JVM, its spark_state workers, liveness, SIGKILL
worker_client    a real worker process spoken to over its socket
s3_server        a loopback S3 endpoint (moto)
jvm_probes       compiling and running the Java probes of tests/jvm
spark            the session builder and the streaming harness (JsonStream, Query, Twin)
scenarios        every stateful operator as a two-phase scenario
running_total    the applyInPandasWithState query many end-to-end tests run
lifecycle        a finished checkpoint, phased runs with a step between, the CLI as a child process
spark_child      a second Spark application (program and handle)
notebook_child, connect_client, wheel_app, wheel_env   programs run in child processes or from a wheel
"""
