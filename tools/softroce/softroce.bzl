"""softroce_test: runs a test binary against a real soft-RoCE device.

Loadable from any workspace that has ibev as a repository:
load("@ibev//tools/softroce:softroce.bzl", "softroce_test"). Labels are made
with Label() so that they name ibev's own targets, not the caller's.
"""

_RUNNER = Label("//tools/softroce:softroce_run.sh")
_EACH = Label("//tools/softroce:run_each.sh")
_GUEST_FILES = Label("//tools/softroce:guest_files")
_BOOST_TEST = Label("//third_party:boost_test")

# Ends one program's arguments in a suite's command line (run_each.sh).
_NEXT = "--next-program--"

def softroce_test(name, binary, devices = 1, args = [], data = [], size = "medium", tags = [], **kwargs):
    """A test target running `binary` against rdma_rxe.

    On the host when it can make rxe devices, otherwise in a throwaway qemu VM
    on Debian's stock kernel (tools/softroce/softroce_run.sh says how). The
    binary's exit status, output and Boost.Test JUnit report are the test's.

    Args:
      name: the test's name.
      binary: a cc_binary label (testonly) using Boost.Test.
      devices: 1 for rxe0 on a dummy netdev; 2 adds rxe1 across a veth pair.
      args: passed to the binary.
      data: more runfiles the binary uses.
      size: the Bazel test size; medium allows 300 s, well above a VM run.
      tags: added to "softroce".
      **kwargs: passed to sh_test.
    """
    native.sh_test(
        name = name,
        srcs = [_RUNNER],
        args = ["--devices", str(devices), "--", "$(rootpath %s)" % binary] + args,
        data = [binary, _GUEST_FILES] + data,
        size = size,
        tags = tags + ["softroce"],
        **kwargs
    )

def softroce_cc_test(name, srcs, deps, devices = 1, args = [], data = [], **kwargs):
    """A Boost.Test cc_binary `name + "_bin"` run as softroce_test `name`."""
    softroce_cc_binary(name = name + "_bin", srcs = srcs, deps = deps)
    softroce_test(
        name = name,
        binary = ":" + name + "_bin",
        devices = devices,
        args = args,
        data = data,
        **kwargs
    )

def softroce_cc_binary(name, srcs, deps):
    """A Boost.Test cc_binary, for softroce_cc_test or a softroce_suite."""
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs,
        deps = deps + [_BOOST_TEST],
    )

def softroce_suite(name, binaries = [], commands = [], devices = 1, data = [], **kwargs):
    """One softroce_test running several test programs in turn, in one VM.

    A VM boot costs more than most soft-RoCE tests themselves under TCG: a
    suite of small tests pays for one. Put in a suite only tests that leave
    the devices as they found them (a test that flaps a link or re-adds a
    device restores it), and whose time together stays well inside the VM's
    timeout in the slowest configuration (TSan). One failure fails the
    suite; its log names the program.

    Args:
      name: the suite's name.
      binaries: softroce_cc_binary labels, each run with no arguments.
      commands: programs that take arguments, each a list: its label, then
        its arguments ($(rootpath) of anything in data). They run after
        binaries, in this order.
      devices: as softroce_test's.
      data: more runfiles the commands use.
      **kwargs: passed to softroce_test.
    """
    runs = [[b] for b in binaries] + commands
    args = []
    for run in runs:
        args += ["$(rootpath %s)" % run[0]] + run[1:] + [_NEXT]
    softroce_test(
        name = name,
        binary = _EACH,
        devices = devices,
        args = args,
        data = [run[0] for run in runs] + data,
        **kwargs
    )
