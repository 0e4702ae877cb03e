// bunfig.toml [test] preload (and the benchmarks' --preload): the undici rewrite of plugin.ts for client-node's clients in tests.
import { plugin } from "bun";
import { undiciShim } from "./plugin.ts";

plugin(undiciShim());
