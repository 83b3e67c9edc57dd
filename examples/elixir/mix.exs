defmodule Orders.MixProject do
  use Mix.Project

  def project do
    [
      app: :orders,
      version: "0.1.0",
      elixir: "~> 1.14",
      deps: [{:gen_durable, path: "../../bindings-elixir"}]
    ]
  end

  def application, do: [extra_applications: [:logger]]
end
