# The compiler that builds the NIF with cargo lives outside lib/ so that it is
# available before this project's own Elixir code is compiled.
unless Code.ensure_loaded?(Mix.Tasks.Compile.GenDurableNif) do
  Code.require_file("mix/compile.gen_durable_nif.ex", __DIR__)
end

defmodule GenDurable.MixProject do
  use Mix.Project

  @version "0.1.0"

  def project do
    [
      app: :gen_durable,
      version: @version,
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      compilers: [:gen_durable_nif] ++ Mix.compilers(),
      elixirc_paths: elixirc_paths(Mix.env()),
      deps: [],
      description: "A durable step engine on PostgreSQL, run by a Rust core inside the BEAM.",
      docs: [main: "GenDurable"]
    ]
  end

  def application do
    [extra_applications: [:logger]]
  end

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]
end
