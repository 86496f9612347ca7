/**
 * Loads an optional peer dependency (a framework) at first use, so that the
 * base client installs and runs without any of them.
 */
export async function peer(name: string, adapter: string): Promise<any> {
  try {
    return await import(name);
  } catch (err) {
    const e = err as { code?: string };
    if (e?.code === "ERR_MODULE_NOT_FOUND") {
      throw new Error(`@idemgate/client/${adapter} needs ${name}: npm install ${name}`);
    }
    throw err;
  }
}
