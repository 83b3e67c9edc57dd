defmodule GenDurable.SchedulerLatencyTest do
  # Large values cross the NIF in both directions (a 100 000-key state
  # inserted and read, a step returning a 3 000 000-element list, read back,
  # a 1 000 000-element signal payload handed to a step) while one ticker
  # process per normal scheduler, bound to it and of high priority, wakes
  # every 10 ms and records how late it woke (see GenDurableTest.Latency).
  #
  # Converting these values takes from tens to hundreds of milliseconds.
  # Done in a NIF on a normal scheduler, it keeps that scheduler's ticker
  # waiting as long. The bound is 50 ms: a scheduler running well-behaved
  # code gets back to a high-priority process within about a millisecond,
  # and the operating system's preemption of the scheduler threads on a busy
  # two-core machine adds a few tens of milliseconds at worst; a call that
  # holds a scheduler for 100 ms or more cannot pass.
  #
  # The measurement runs in a VM of its own, started without busy waiting
  # (`+sbwt none +sbwtdcpu none +sbwtdio none`, as the README recommends on
  # small machines): with few cores, a scheduler that busy-waits for work
  # yields its core to the VM's own busy threads (the dirty schedulers
  # converting values, the engine's runtime) again and again, and misses
  # its timers for hundreds of milliseconds while no code runs on it, which
  # would hide what this test measures.
  use ExUnit.Case, async: false
  import GenDurable.TestHelper

  @moduletag timeout: 900_000
  @bound 50

  test "large values crossing the NIF do not block a normal scheduler" do
    flags = ~w(+sbwt none +sbwtdcpu none +sbwtdio none)c
    paths = Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
    {:ok, peer, _} = :peer.start(%{connection: :standard_io, args: paths ++ flags})

    r =
      try do
        :peer.call(peer, GenDurableTest.Latency, :run, [url(), "ex_lat#{unique()}"], 800_000)
      after
        :peer.stop(peer)
      end

    assert r.wide_equal
    assert r.list_length == 3_000_000
    assert r.payload_length == 1_000_000

    assert r.worst < @bound,
           "a scheduler was #{r.worst} ms late (#{r.baseline} ms with nothing crossing the NIF)"
  end
end
