defmodule Mix.Tasks.Compile.GenDurableNif do
  @moduledoc """
  Builds the `gendurable_nif` crate with cargo and copies the library into
  `priv/`.

  A release build in the `:prod` environment, a debug build otherwise. Set
  `GENDURABLE_NIF_PROFILE=release` (or `debug`) to choose explicitly. The
  cargo target directory is taken from `CARGO_TARGET_DIR` or from
  `cargo metadata`.
  """
  use Mix.Task.Compiler

  @crate "gendurable_nif"

  @impl true
  def run(_args) do
    root = Path.expand("..", __DIR__)
    manifest = Path.join([root, "native", @crate, "Cargo.toml"])
    profile = profile()

    args =
      ["build", "--manifest-path", manifest, "--lib"] ++
        if profile == "release", do: ["--release"], else: []

    Mix.shell().info("Compiling NIF #{@crate} (#{profile})")

    case System.cmd("cargo", args, stderr_to_stdout: true, into: IO.stream(:stdio, :line)) do
      {_, 0} ->
        copy(target_dir(manifest), profile, root)

      {_, status} ->
        Mix.raise("cargo build of #{@crate} failed with exit status #{status}")
    end
  end

  defp profile do
    case System.get_env("GENDURABLE_NIF_PROFILE") do
      p when p in ["release", "debug"] -> p
      _ -> if Mix.env() == :prod, do: "release", else: "debug"
    end
  end

  defp target_dir(manifest) do
    case System.get_env("CARGO_TARGET_DIR") do
      dir when is_binary(dir) and dir != "" ->
        Path.expand(dir)

      _ ->
        {out, 0} =
          System.cmd("cargo", [
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--manifest-path",
            manifest
          ])

        case Regex.run(~r/"target_directory":"((?:[^"\\]|\\.)*)"/, out) do
          [_, dir] -> String.replace(dir, "\\\\", "\\")
          _ -> Mix.raise("cannot find cargo's target directory in `cargo metadata`")
        end
    end
  end

  defp copy(target, profile, root) do
    {lib, ext} =
      case :os.type() do
        {:unix, :darwin} -> {"lib#{@crate}.dylib", "so"}
        {:win32, _} -> {"#{@crate}.dll", "dll"}
        _ -> {"lib#{@crate}.so", "so"}
      end

    src = Path.join([target, profile, lib])
    priv = Path.join(root, "priv")
    dst = Path.join(priv, "lib#{@crate}.#{ext}")
    File.mkdir_p!(priv)
    # Link (or copy) priv/ into _build now that it exists.
    Mix.Project.build_structure()

    if stale?(src, dst) do
      # Copy to a new file and rename it into place: a library already loaded
      # by a running VM keeps its old inode.
      tmp = dst <> ".tmp"
      File.cp!(src, tmp)
      File.rename!(tmp, dst)
      {:ok, []}
    else
      {:noop, []}
    end
  end

  defp stale?(src, dst) do
    case {File.stat(src), File.stat(dst)} do
      {{:ok, s}, {:ok, d}} -> s.mtime > d.mtime or s.size != d.size
      {{:ok, _}, _} -> true
      {{:error, reason}, _} -> Mix.raise("the NIF library #{src} is missing: #{inspect(reason)}")
    end
  end
end
