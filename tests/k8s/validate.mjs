// Validates Kubernetes manifests offline against the API schemas of the
// npm package kubernetes-models: every document of every file, by its
// apiVersion and kind. Prints one line per object; exits 1 on the first
// invalid one, naming it and the schema's complaint.
//
//   node tests/k8s/validate.mjs FILE.yaml...
// (after `npm ci --prefix tests/k8s`; scripts/bootstrap does it)
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

async function modelFor(apiVersion, kind) {
  // core/v1 lives under "v1"; groups under GROUP/VERSION.
  const path = `kubernetes-models/${apiVersion}/${kind}`;
  try {
    return (await import(path))[kind];
  } catch (e) {
    throw new Error(`no schema for ${apiVersion} ${kind} (${path}): ${e.message}`);
  }
}

let objects = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length > 0) {
      console.error(`${file}: YAML: ${doc.errors[0].message}`);
      process.exit(1);
    }
    const object = doc.toJS();
    if (object === null) continue;
    const name = `${file}: ${object.apiVersion} ${object.kind} ${object.metadata?.name}`;
    try {
      const Model = await modelFor(object.apiVersion, object.kind);
      new Model(object).validate();
    } catch (e) {
      console.error(`${name}: ${e.message}`);
      process.exit(1);
    }
    console.log(`valid: ${name}`);
    objects += 1;
  }
}
if (objects === 0) {
  console.error("validate: no Kubernetes objects in " + process.argv.slice(2).join(" "));
  process.exit(1);
}
