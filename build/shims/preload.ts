// bunfig.toml [test] preload: the same undici rewrite as the compiled binary gets, for `bun test`.
import { plugin } from "bun";
import { undiciShim } from "./plugin.ts";

plugin(undiciShim());
