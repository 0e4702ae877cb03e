// Subcommand dispatch. Each command module is imported only when it runs, so `trellis version`
// does not pay for loading the Kubernetes client or D-Bus.
import { describeError, journalPrefix } from "../log.ts";
import { applyRuntimeEnv } from "../runtime.ts";
import { UsageError } from "./errors.ts";

type Command = { summary: string; load: () => Promise<{ run(args: string[]): Promise<number> }> };

const commands: Record<string, Command> = {
  run: { summary: "run the node agent (the default when no command is given)", load: () => import("./run.ts") },
  plan: { summary: "show what applying an OSC file would change on this machine, and why", load: () => import("./plan.ts") },
  apply: { summary: "apply an OSC file to this machine without a cluster", load: () => import("./apply.ts") },
  "check-config": { summary: "check that this binary can read the NodeAgentConfiguration in --config-dir", load: () => import("./check-config.ts") },
  bootstrap: { summary: "set up a new machine: the agent's client certificate (CSR), kubelet's bootstrap kubeconfig, the agent's unit", load: () => import("./bootstrap.ts") },
  rollout: { summary: "a pool's fleet rollout: slots and their holders, windows, each node updated, waiting, failed or paused", load: () => import("./rollout.ts") },
  status: { summary: "how the agent on this node is doing: applied OSC, unfinished apply, controllers, running or not", load: () => import("./status.ts") },
  version: { summary: "print version, git commit and runtime", load: () => import("./version.ts") },
  whoami: { summary: "connect to the API server and print its version and who trellis is there", load: () => import("./whoami.ts") },
  systemd: { summary: "talk to systemd over D-Bus: daemon-reload, enable, disable, start, restart, stop, status", load: () => import("./systemd.ts") },
};

function usage(): string {
  const width = Math.max(...Object.keys(commands).map((n) => n.length));
  const lines = Object.entries(commands).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`);
  return ["usage: trellis <command> [flags]", "", "commands:", ...lines, "", "`trellis <command> --help` describes a command's flags."].join("\n");
}

export async function main(argv: string[]): Promise<number> {
  // Like gardener-node-agent, the agent is what runs without a command (flags only).
  const first = argv[0];
  const [name = "run", ...rest] = first === undefined || (first.startsWith("--") && first !== "--help") ? ["run", ...argv] : argv;
  if (name === "help" || name === "--help" || name === "-h") {
    console.log(usage());
    return 0;
  }
  const command = commands[name];
  if (!command) {
    console.error(`trellis: unknown command "${name}"\n\n${usage()}`);
    return 2;
  }
  // The agent runs long: before it loads anything, it may execute itself once more with the runtime's
  // settings (src/runtime-env.ts). The short commands keep the runtime's defaults.
  if (name === "run") applyRuntimeEnv();
  try {
    return await (await command.load()).run(rest);
  } catch (err) {
    // Under systemd, the one line that says why the agent ended is an error to journald too.
    process.stderr.write(`${journalPrefix("error")}trellis ${name}: ${err instanceof UsageError ? err.message : describeError(err)}\n`);
    return err instanceof UsageError ? 2 : 1;
  }
}
