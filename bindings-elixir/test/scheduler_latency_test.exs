defmodule GenDurable.SchedulerLatencyTest do
  # Large values cross the NIF in both directions (a 100 000-key state
  # inserted and read, a step returning a 3 000 000-element list, read back,
  # a 1 000 000-element signal payload handed to a step) while one ticker
  # process per normal scheduler, bound to it and of high priority, wakes
  # every 10 ms and records how late it woke (see GenDurableTest.Latency).
  #
  # Converting these values takes from tens to hundreds of milliseconds.
  # Done in a NIF on a normal scheduler, it keeps that scheduler's ticker
  # waiting as long (700 ms and more with the step's answer converted that
  # way). The bound is 50 ms: a scheduler running well-behaved code gets
  # back to a high-priority process within about a millisecond, and the
  # operating system's preemption of the VM's threads adds a few tens of
  # milliseconds on a busy two-core machine; a call that holds a scheduler
  # for 100 ms or more cannot pass.
  #
  # A NIF that holds a scheduler makes every run late; the operating system
  # makes a run late now and then when other programs load the machine. So
  # the values cross up to five times, and one run under the bound passes.
  # A failure lists the processes the VM saw hold a scheduler for 20 ms or
  # more: none means the machine, not the VM, was late.
  #
  # The measurement runs in a VM of its own, started so that a scheduler is
  # late only when something holds it:
  #
  # * without busy waiting (`+sbwt none +sbwtdcpu none +sbwtdio none`, as
  #   the README recommends on small machines): with few cores, a scheduler
  #   that busy-waits for work yields its core to the VM's own busy threads
  #   (the dirty schedulers converting values, the engine's runtime) again
  #   and again, and misses its timers for hundreds of milliseconds while no
  #   code runs on it;
  # * with scheduler utilization balancing (`+sub true`) instead of load
  #   compaction, which takes lightly loaded schedulers out of service: a
  #   ticker bound to one would wait for the next load check, about 100 ms.
  use ExUnit.Case, async: false
  import GenDurable.TestHelper

  @moduletag timeout: 900_000
  @bound 50
  @runs 5

  test "large values crossing the NIF do not block a normal scheduler" do
    flags = ~w(+sbwt none +sbwtdcpu none +sbwtdio none +sub true)c
    paths = Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
    {:ok, peer, _} = :peer.start(%{connection: :standard_io, args: paths ++ flags})

    r =
      try do
        args = [url(), "ex_lat#{unique()}", @bound, @runs]
        :peer.call(peer, GenDurableTest.Latency, :run, args, 800_000)
      after
        :peer.stop(peer)
      end

    assert Enum.all?(r.runs, & &1.whole), "values did not come back whole: #{inspect(r)}"
    worst = Enum.map(r.runs, & &1.worst)

    held = Enum.flat_map(r.runs, & &1.held)

    assert Enum.min(worst) < @bound,
           "a scheduler was late by #{inspect(worst)} ms in #{length(worst)} runs " <>
             "(#{r.baseline} ms with nothing crossing the NIF); processes that held " <>
             "a scheduler for 20 ms or more: #{inspect(held)}"
  end
end
