"""mrun_util.py - what the Python tests that run mcc / mrun share
(tests/gptdata, tests/eval, tests/packed): an environment for MPI ranks on
a shared 2-core machine, a failure that ends the test, and a command run
that fails the test when it should succeed and does not."""
import os
import subprocess
import sys

# ranks oversubscribe the machine: one BLAS / kernel thread each, MPI yields
ENV = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1",
           OPENBLAS_NUM_THREADS="1", TS_THREADS="1")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(cmd, ok=True, env=None):
    """cmd's CompletedProcess (text); with ok, a non-zero exit fails the test."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or ENV)
    if ok and p.returncode != 0:
        fail("%s exited %d:\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p
