defmodule GenDurable.BulkheadTest do
  use ExUnit.Case, async: true
  import GenDurable.TestHelper, only: [eventually: 1, unique: 0]

  alias GenDurable.Bulkhead

  defp service, do: "svc-#{unique()}"

  # Starts a process that takes a slot and holds it until told to finish.
  defp hold(svc) do
    test = self()

    pid =
      spawn(fn ->
        Bulkhead.call(svc, fn ->
          send(test, {:holding, self()})

          receive do
            :finish -> :ok
          end
        end)

        send(test, {:finished, self()})
      end)

    assert_receive {:holding, ^pid}
    pid
  end

  test "calls run under the limit and return the function's value" do
    svc = service()
    assert :ok = Bulkhead.configure(svc, limit: 2, reclaim_after: 60_000)
    assert Bulkhead.limit(svc) == 2
    assert Bulkhead.call(svc, fn -> {:ok, 42} end) == {:ok, 42}
    assert Bulkhead.in_flight(svc) == 0
  end

  test "over the limit a call is saturated at once, and the function is not run" do
    svc = service()
    :ok = Bulkhead.configure(svc, limit: 1, reclaim_after: 60_000)
    holder = hold(svc)
    assert Bulkhead.in_flight(svc) == 1
    assert Bulkhead.call(svc, fn -> flunk("must not run") end) == {Bulkhead, :saturated}
    send(holder, :finish)
    assert_receive {:finished, ^holder}
    assert Bulkhead.in_flight(svc) == 0
    assert Bulkhead.call(svc, fn -> :ran end) == :ran
  end

  test "a slot is released when the function raises, throws or exits" do
    svc = service()
    :ok = Bulkhead.configure(svc, limit: 1, reclaim_after: 60_000)
    assert_raise RuntimeError, fn -> Bulkhead.call(svc, fn -> raise "boom" end) end
    assert catch_throw(Bulkhead.call(svc, fn -> throw(:x) end)) == :x
    assert catch_exit(Bulkhead.call(svc, fn -> exit(:bye) end)) == :bye
    assert Bulkhead.in_flight(svc) == 0
  end

  test "wait: a caller waits for a slot freed within its budget" do
    svc = service()
    :ok = Bulkhead.configure(svc, limit: 1, reclaim_after: 60_000, wait: 30_000)
    holder = hold(svc)
    test = self()

    waiter =
      spawn(fn ->
        send(test, {:result, Bulkhead.call(svc, fn -> :after_wait end)})
      end)

    # The waiter is parked in receive (not on a scheduler) and holds no slot.
    eventually(fn -> Process.info(waiter, :status) == {:status, :waiting} end)
    assert Bulkhead.in_flight(svc) == 1
    send(holder, :finish)
    assert_receive {:result, :after_wait}, 30_000
  end

  test "wait: a caller gives up after its budget" do
    svc = service()
    :ok = Bulkhead.configure(svc, limit: 1, reclaim_after: 60_000, wait: 50)
    holder = hold(svc)
    assert Bulkhead.call(svc, fn -> :no end) == {Bulkhead, :saturated}
    send(holder, :finish)
  end

  test "reset frees every slot; unknown services" do
    svc = service()
    :ok = Bulkhead.configure(svc, limit: 1, reclaim_after: 60_000)
    holder = hold(svc)
    assert Bulkhead.in_flight(svc) == 1
    assert Bulkhead.reset(svc) == :ok
    assert Bulkhead.in_flight(svc) == 0
    assert Bulkhead.call(svc, fn -> :ran end) == :ran
    # The old holder's release does not free anybody else's slot.
    send(holder, :finish)
    assert_receive {:finished, ^holder}

    unknown = service()
    assert Bulkhead.in_flight(unknown) == 0
    assert Bulkhead.limit(unknown) == nil
    assert Bulkhead.reset(unknown) == {:error, :not_found}
    # No limit: calls pass straight through.
    assert Bulkhead.call(unknown, fn -> :through end) == :through
  end

  test "a process killed mid-call frees its slot when its permit is collected" do
    svc = service()
    :ok = Bulkhead.configure(svc, limit: 1, reclaim_after: 600_000)
    holder = hold(svc)
    ref = Process.monitor(holder)
    Process.exit(holder, :kill)
    assert_receive {:DOWN, ^ref, :process, _, :killed}
    eventually(fn -> Bulkhead.in_flight(svc) == 0 end)
    assert Bulkhead.call(svc, fn -> :ran end) == :ran
  end

  test "a slot whose release is lost is taken over after reclaim_after" do
    svc = service()
    :ok = Bulkhead.configure(svc, limit: 1, reclaim_after: 200)
    test = self()

    # The permit outlives its process (a copy is kept elsewhere): the killed
    # process leaks its slot, but only until reclaim_after.
    holder =
      spawn(fn ->
        ref = make_ref()
        {:ok, permit} = GenDurable.Native.bulkhead_acquire(svc, ref)
        send(test, {:permit, permit})
        Process.sleep(:infinity)
      end)

    assert_receive {:permit, permit}
    Process.exit(holder, :kill)
    assert Bulkhead.in_flight(svc) == 1
    assert Bulkhead.call(svc, fn -> :no end) == {Bulkhead, :saturated}
    eventually(fn -> Bulkhead.call(svc, fn -> :reclaimed end) == :reclaimed end)
    # The late release of the reclaimed permit frees nothing it does not own.
    GenDurable.Native.bulkhead_release(permit)
    assert Bulkhead.in_flight(svc) == 0
  end

  test "invalid configurations are refused" do
    svc = service()

    assert {:error, %GenDurable.Error{kind: :invalid_config, message: m}} =
             Bulkhead.configure(svc, limit: 1, reclaim_after: 1000, wait: :infinity)

    assert m =~ "unbounded"
    assert {:error, %{message: m}} = Bulkhead.configure(svc, limit: 1)
    assert m =~ ":reclaim_after is required"
    assert {:error, %{message: m}} = Bulkhead.configure(svc, limit: 0, reclaim_after: 1000)
    assert m =~ ":limit must be a positive integer"
    assert {:error, %{message: m}} = Bulkhead.configure(svc, limit: 2_000_000, reclaim_after: 1)
    assert m =~ "limit must be at most"
    assert {:error, %{message: m}} = Bulkhead.configure(svc, limit: 1, reclaim_after: 1, size: 3)
    assert m =~ "unknown bulkhead option :size"
    assert_raise GenDurable.Error, fn -> Bulkhead.configure!(svc, limit: -1, reclaim_after: 1) end
    assert Bulkhead.limit(svc) == nil
  end
end
