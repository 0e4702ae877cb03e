// The decision of src/controllers/internal-ip.ts, read from gardener-node-agent's ensureNodeInternalIP
// (healthcheck/kubelet.go): remember the InternalIP while the Node has one, do nothing while it has an
// ExternalIP, and restore the remembered one only when the Node has neither and this host still has it.
import { describe, expect, test } from "bun:test";
import type { V1NodeAddress } from "@kubernetes/client-node";
import { type AddressDecision, canonicalIp, decideAddresses } from "../../src/controllers/internal-ip.ts";

const internal = (address: string): V1NodeAddress => ({ type: "InternalIP", address });
const external = (address: string): V1NodeAddress => ({ type: "ExternalIP", address });
const hostName: V1NodeAddress = { type: "Hostname", address: "node-a" };
const host = ["127.0.0.1", "::1", "10.250.0.5", "FE80:0:0:0:A8BB:CCFF:FEDD:EEFF"];

const cases: [string, V1NodeAddress[] | undefined, string | undefined, AddressDecision][] = [
  ["an InternalIP is remembered", [hostName, internal("10.250.0.5")], undefined, { do: "remember", ip: "10.250.0.5" }],
  ["a new InternalIP replaces the one remembered", [internal("10.250.0.9")], "10.250.0.5", { do: "remember", ip: "10.250.0.9" }],
  ["of two InternalIPs the last counts", [internal("10.250.0.5"), internal("10.250.0.6")], undefined, { do: "remember", ip: "10.250.0.6" }],
  ["an InternalIP with an ExternalIP is remembered", [external("198.51.100.1"), internal("10.250.0.5")], undefined, { do: "remember", ip: "10.250.0.5" }],
  ["an IPv6 InternalIP, in one spelling", [internal("2001:DB8:0:0::1")], undefined, { do: "remember", ip: "2001:db8::1" }],
  ["an InternalIP that is no address keeps the one remembered", [internal("10.250.0.500")], "10.250.0.5", { do: "ignore", invalid: "10.250.0.500" }],
  ["an ExternalIP alone: nothing", [external("198.51.100.1")], "10.250.0.5", { do: "nothing" }],
  ["neither, none remembered (a restarted agent): said only", [hostName], undefined, { do: "report" }],
  ["no addresses at all, the remembered one still the host's: restored", undefined, "10.250.0.5", { do: "report", restore: "10.250.0.5" }],
  ["neither, the remembered one still the host's: restored", [hostName], "10.250.0.5", { do: "report", restore: "10.250.0.5" }],
  ["an empty InternalIP counts as none", [internal("10.250.0.5"), internal("")], "10.250.0.5", { do: "report", restore: "10.250.0.5" }],
  ["neither, the remembered one no longer the host's: said only", [hostName], "10.250.0.77", { do: "report" }],
  ["an IPv6 address of the host, spelled otherwise by the interface", [], "fe80::a8bb:ccff:fedd:eeff", { do: "report", restore: "fe80::a8bb:ccff:fedd:eeff" }],
];

describe("decideAddresses", () => {
  test.each(cases)("%s", (_, addresses, remembered, decision) => {
    expect(decideAddresses(addresses, remembered, () => host)).toEqual(decision);
  });

  test("this host's addresses are listed only when the Node has neither kind, and a listing that fails is said", () => {
    const failing = () => {
      throw new Error("getifaddrs failed");
    };
    expect(decideAddresses([internal("10.250.0.5")], "10.250.0.5", failing)).toEqual({ do: "remember", ip: "10.250.0.5" });
    expect(decideAddresses([external("198.51.100.1")], "10.250.0.5", failing)).toEqual({ do: "nothing" });
    expect(decideAddresses([], undefined, failing)).toEqual({ do: "report" });
    expect(decideAddresses([], "10.250.0.5", failing)).toEqual({ do: "report", hostAddressesError: "getifaddrs failed" });
  });
});

test.each([
  ["10.0.0.1", "10.0.0.1"],
  ["0.0.0.0", "0.0.0.0"],
  ["255.255.255.255", "255.255.255.255"],
  ["010.0.0.1", undefined],
  ["10.0.0.256", undefined],
  ["10.0.0", undefined],
  ["2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"],
  ["FE80::1", "fe80::1"],
  ["::ffff:10.0.0.1", "::ffff:a00:1"],
  ["fe80::1%eth0", undefined],
  ["node-a", undefined],
  ["", undefined],
])("canonicalIp(%p) is %p", (text, canonical) => {
  expect(canonicalIp(text)).toBe(canonical);
});
