defmodule GenDurable.CronTest do
  # Periodic workflows: the engine's `:cron` entries, `{schedule, workflow,
  # opts}`, become the core's cron option; the core parses and checks them
  # and inserts each tick once.
  use ExUnit.Case, async: true
  import GenDurable.TestHelper

  alias GenDurable.{Error, Native, Options}
  alias GenDurableTest.Tick

  test "an entry inserts its instance at every tick" do
    t = register()

    e =
      start_engine(
        workflows: [Tick],
        cron: [
          {"* * * * * *", Tick,
           state: %{"test" => t, "kind" => "tick"}, name: "every-second", missed: :skip}
        ]
      )

    assert_receive {:gd, first, "start", _, _}, 10_000
    assert_receive {:gd, second, "start", _, _}, 10_000
    assert first != second

    for id <- [first, second] do
      i = wait_status(e, id, :completed)
      assert {i.workflow, i.state} == {"GenDurableTest.Tick", %{"test" => t, "kind" => "tick"}}
    end
  end

  test "entries become the core's: entry options apart, the rest an insert's" do
    {:ok, v} =
      Options.validate(
        engine_opts(
          workflows: [Tick],
          cron: [
            {"*/5 * * * *", Tick,
             state: %{account: 7},
             queue: "reports",
             priority: 3,
             concurrency_key: {:report, 7},
             name: "reports",
             timezone: "Europe/Paris",
             missed: :all},
            {"@daily", "Elsewhere.Cleanup"},
            %{schedule: "0 6 * * *", instance: [workflow: "Elsewhere.Digest"]}
          ]
        )
      )

    assert v.config.options["cron"] == [
             %{
               "schedule" => "*/5 * * * *",
               "name" => "reports",
               "timezone" => "Europe/Paris",
               "missed" => :all,
               "instance" => %{
                 workflow: "GenDurableTest.Tick",
                 state: %{account: 7},
                 queue: "reports",
                 priority: 3,
                 concurrency_key: "report:7"
               }
             },
             %{"schedule" => "@daily", "instance" => %{workflow: "Elsewhere.Cleanup"}},
             # Passed on, keyword lists as maps.
             %{schedule: "0 6 * * *", instance: %{"workflow" => "Elsewhere.Digest"}}
           ]

    assert Native.engine_check(v.config.options, v.config.workflows) == :ok
  end

  test "an entry refused names it" do
    Process.flag(:trap_exit, true)

    for {entry, text} <- [
          {{"not a schedule", Tick},
           ~s(cron "GenDurableTest.Tick": schedule "not a schedule": Invalid pattern)},
          {{"* * * * *", NoSuch.Module},
           "engine option cron[0]: invalid workflow: no module NoSuch.Module is available"},
          {{"* * * * *", Tick, missed: :never},
           ~s(engine option cron[0].missed: expected "latest", "all" or "skip", got "never")},
          {{"* * * * *", Tick, priority: "x"},
           ~s(engine option cron[0].instance.priority: expected an integer, got "x")},
          {{"* * * * *", Tick, name: "a", name: "b"},
           ~s(engine option cron[0]: "name" is given twice)},
          {{"* * * * *", Tick, :daily},
           "engine option cron[0]: the options must be a keyword list"},
          {{"* * * * *", Tick, engine: :other},
           "engine option cron[0]: :engine is not an option of a cron entry"},
          {{"* * * * *"}, "engine option cron[0]: expected {schedule, workflow} or"},
          {{"* * * * *", Tick, timezone: "Mars/Olympus"}, "Mars/Olympus"}
        ] do
      assert {:error, %Error{kind: :invalid_config, message: m}} =
               GenDurable.start_link(engine_opts(workflows: [Tick], cron: [entry]))

      assert m =~ text, "#{inspect(entry)}: #{m}"
    end

    assert {:error, %Error{message: m}} =
             GenDurable.start_link(
               engine_opts(workflows: [Tick], cron: [{"* * * * *", Tick}, {"@hourly", Tick}])
             )

    assert m =~ ~s(cron "GenDurableTest.Tick" is configured twice)

    assert {:error, %Error{message: m}} =
             GenDurable.start_link(engine_opts(workflows: [Tick], cron: :daily))

    assert m =~ "engine option cron: expected a list"
  end
end
