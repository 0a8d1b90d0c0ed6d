// The propose page's structured editor: the common limits of the workspace and of each
// provider as number fields beside the JSON document. Both write the same document: a field
// changes its key in the JSON (a blank field removes it), and editing the JSON refills the
// fields. The JSON stays the document that is proposed; the server validates it.
(function () {
  "use strict";
  var KEYS = [
    ["concurrency", "concurrency"],
    ["requestsPerMinute", "requests / min"],
    ["tokensPerSecond", "tokens / s"],
    ["maxQueueLength", "queue length"],
    ["maxQueueWaitMs", "queue wait ms"],
  ];
  var textarea = document.getElementById("id_document");
  var box = document.getElementById("limits-editor");
  if (!textarea || !box) return;
  var table = box.querySelector("table");
  var status = box.querySelector(".limits-editor-status");

  function parse() {
    try {
      var doc = JSON.parse(textarea.value);
      return doc && typeof doc === "object" && !Array.isArray(doc) ? doc : null;
    } catch (error) {
      return null;
    }
  }

  function scopes(doc) {
    var found = [];
    if (doc.workspace && typeof doc.workspace === "object") {
      found.push({ name: "workspace", path: ["workspace"], limits: doc.workspace });
    }
    var providers = doc.providers && typeof doc.providers === "object" ? doc.providers : {};
    Object.keys(providers).forEach(function (id) {
      if (providers[id] && typeof providers[id] === "object") {
        found.push({ name: "provider " + id, path: ["providers", id], limits: providers[id] });
      }
    });
    return found;
  }

  function limitsAt(doc, path) {
    return path.reduce(function (node, key) { return node[key]; }, doc);
  }

  function render(doc) {
    var body = table.tBodies[0];
    body.textContent = "";
    scopes(doc).forEach(function (scope) {
      var row = body.insertRow();
      row.dataset.scope = scope.path.join(".");
      row.insertCell().textContent = scope.name;
      KEYS.forEach(function (pair) {
        var input = document.createElement("input");
        input.type = "number";
        input.min = "0";
        input.step = "any";
        input.setAttribute("aria-label", scope.name + " " + pair[1]);
        input.dataset.key = pair[0];
        var value = scope.limits[pair[0]];
        input.value = typeof value === "number" ? String(value) : "";
        input.addEventListener("input", function () { write(scope.path, pair[0], input); });
        row.insertCell().appendChild(input);
      });
    });
  }

  function write(path, key, input) {
    var doc = parse();
    if (doc === null) return;
    var limits = limitsAt(doc, path);
    if (!limits || typeof limits !== "object") return;
    if (input.value.trim() === "") {
      delete limits[key];
    } else {
      var number = Number(input.value);
      if (!isFinite(number)) return;
      limits[key] = number;
    }
    textarea.value = JSON.stringify(doc, null, 2);
    status.textContent = "Wrote " + path.join(".") + "." + key + " into the JSON.";
  }

  function refill() {
    var doc = parse();
    if (doc === null) {
      status.textContent = "The JSON does not parse: the fields wait until it does.";
      table.classList.add("stale");
      return;
    }
    status.textContent = "";
    table.classList.remove("stale");
    render(doc);
  }

  var head = table.tHead.rows[0];
  KEYS.forEach(function (pair) {
    var th = document.createElement("th");
    th.textContent = pair[0];
    th.title = pair[1];
    head.appendChild(th);
  });
  textarea.addEventListener("input", refill);
  box.hidden = false;
  refill();
})();
