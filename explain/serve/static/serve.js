// The page of `explain serve`: plain DOM and canvas, no framework, nothing from a network.
// Every value comes from the server's JSON; maps are drawn from their raw grids so that a
// hover reads the exact value the engine computed. Text from the model or the user is only
// ever set as textContent, never as HTML.
"use strict";

const ALPHA = 0.8; // heatmap opacity where |relevance| is largest (it fades with relevance)
const MAP_SIZE = 224; // CSS pixels of the longer side of a drawn map

const state = {
  info: null,
  gallery: null,
  item: null, // the image being viewed: a gallery path or upload/SHA
  names: new Map(), // upload/SHA -> the name of the file uploaded (what the page calls it)
  answer: null, // the last image answer
  text: null, // the last explained text
  textAnswer: null,
  ticket: 0, // the latest image request: an older answer arriving late is dropped
  cards: new Map(), // gallery path -> its card
  pending: 0, // requests in flight
};

const $ = (id) => document.getElementById(id);

function show(id) {
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.id !== id;
}

function say(message) {
  const box = $("message");
  box.textContent = message || "";
  box.hidden = !message;
}

async function call(url, options = {}) {
  const response = await fetch(url, options);
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error || message;
    } catch (_) {
      /* not JSON: keep the status line */
    }
    throw new Error(message);
  }
  return response;
}

async function post(url, body) {
  const response = await call(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  return response.json();
}

// Run `promise` with the page marked busy (while any request is in flight), its error
// shown as the page's message.
function busy(promise) {
  state.pending += 1;
  document.body.classList.add("busy");
  say("");
  return promise
    .catch((error) => say(error.message))
    .finally(() => {
      state.pending -= 1;
      if (!state.pending) document.body.classList.remove("busy");
    });
}

// --- colour ----------------------------------------------------------------------------

// [r, g, b, a] of a display value: [0, 1] on the sequential map, [-1, 1] on the diverging
// one; the opacity follows |value| (as explain.viz draws overlays).
function colour(value, signed) {
  const lut = signed ? state.info.colormaps.diverging : state.info.colormaps.sequential;
  const position = signed ? (value + 1) / 2 : value;
  const index = Math.max(0, Math.min(lut.length - 1, Math.round(position * (lut.length - 1))));
  const [r, g, b] = lut[index];
  return [r, g, b, Math.abs(value) * ALPHA];
}

function cssColour(value, signed) {
  const [r, g, b, a] = colour(value, signed);
  return `rgba(${r}, ${g}, ${b}, ${a.toFixed(3)})`;
}

function format(value) {
  return Number(value).toPrecision(4);
}

// Draw `map` ({values, display, signed, marked, note}) over the loaded image `picture`
// (the image in grey: loadPicture) on a new canvas; hovering it reports the raw value of
// the patch under the pointer to `readout`.
function mapCanvas(picture, map, label, readout) {
  const rows = map.display.length;
  const columns = map.display[0].length;
  const scale = MAP_SIZE / Math.max(picture.naturalWidth, picture.naturalHeight);
  const canvas = document.createElement("canvas");
  canvas.width = Math.round(picture.naturalWidth * scale);
  canvas.height = Math.round(picture.naturalHeight * scale);
  canvas.className = "map";
  canvas.dataset.signed = String(map.signed);
  const context = canvas.getContext("2d");
  context.drawImage(picture, 0, 0, canvas.width, canvas.height);
  const grid = document.createElement("canvas");
  grid.width = columns;
  grid.height = rows;
  const pixels = grid.getContext("2d").createImageData(columns, rows);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < columns; c++) {
      const [red, green, blue, alpha] = colour(map.display[r][c], map.signed);
      pixels.data.set([red, green, blue, Math.round(alpha * 255)], 4 * (r * columns + c));
    }
  }
  grid.getContext("2d").putImageData(pixels, 0, 0);
  context.imageSmoothingEnabled = true; // bilinear, as Explanation.heatmap upsamples
  context.drawImage(grid, 0, 0, canvas.width, canvas.height);
  canvas.addEventListener("mousemove", (event) => {
    const box = canvas.getBoundingClientRect();
    const c = Math.min(columns - 1, Math.floor(((event.clientX - box.left) / box.width) * columns));
    const r = Math.min(rows - 1, Math.floor(((event.clientY - box.top) / box.height) * rows));
    const value = map.values[r][c];
    readout.textContent = `${label}: patch (${r}, ${c}) = ${format(value)}`;
    readout.dataset.value = String(value);
    readout.dataset.row = String(r);
    readout.dataset.column = String(c);
  });
  return canvas;
}

// The ± of a signed map in a view that also shows unsigned ones: it reads the diverging
// key, as that key's title says.
function signedMark() {
  const mark = document.createElement("span");
  mark.className = "mark";
  mark.textContent = "±";
  mark.title = "signed map: red for, blue against (the ± key)";
  return mark;
}

// `canvas` in a panel that carries the ± mark when `map.marked`.
function panel(canvas, map) {
  const box = document.createElement("div");
  box.className = "panel";
  box.append(canvas);
  if (map.marked) box.append(signedMark());
  return box;
}

// The colour keys of a view: each a gradient with its ends labelled (the rule's units).
function drawKeys(container, keys) {
  container.replaceChildren(
    ...keys.map((key) => {
      const box = document.createElement("div");
      box.className = "key";
      box.dataset.signed = String(key.signed);
      const title = document.createElement("div");
      title.className = "title";
      title.textContent = key.title;
      const bar = document.createElement("canvas");
      bar.width = 200;
      bar.height = 1;
      const pixels = bar.getContext("2d").createImageData(200, 1);
      for (let x = 0; x < 200; x++) {
        const value = key.signed ? (2 * x) / 199 - 1 : x / 199;
        const [r, g, b] = colour(value, key.signed);
        pixels.data.set([r, g, b, 255], 4 * x);
      }
      bar.getContext("2d").putImageData(pixels, 0, 0);
      const ends = document.createElement("div");
      ends.className = "ends";
      for (const label of key.labels) {
        const end = document.createElement("span");
        end.textContent = label;
        ends.append(end);
      }
      box.append(title, bar, ends);
      return box;
    }),
  );
}

// The image `item` as the maps are drawn over it: in grey, as the figures draw it, so
// that every colour is relevance and a red object is never taken for heat.
function loadPicture(item) {
  return new Promise((resolve, reject) => {
    const picture = new Image();
    picture.onload = () => resolve(picture);
    picture.onerror = () => reject(new Error(`cannot load the image ${nameOf(item)}`));
    picture.src = `/api/view?item=${encodeURIComponent(item)}&background=grey`;
  });
}

// What the page calls `item`: a gallery image's path, an upload's file name.
function nameOf(item) {
  return state.names.get(item) || item;
}

function download(blob, name) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

// What `container` shows (its canvases, and its labels, tokens and captions as text),
// laid out as on the page, as one PNG download.
function exportSheet(container, name) {
  const canvases = [...container.querySelectorAll("canvas")];
  if (!canvases.length && !container.querySelector(".token")) return say("nothing to export yet");
  const origin = container.getBoundingClientRect();
  const sheet = document.createElement("canvas");
  sheet.width = Math.ceil(origin.width);
  sheet.height = Math.ceil(origin.height);
  const context = sheet.getContext("2d");
  context.fillStyle = "white";
  context.fillRect(0, 0, sheet.width, sheet.height);
  for (const canvas of canvases) {
    const box = canvas.getBoundingClientRect();
    context.drawImage(canvas, box.left - origin.left, box.top - origin.top, box.width, box.height);
  }
  const texts = container.querySelectorAll("th, .caption, .title, .ends span, .row-label, .token, .panel .mark, .note, .error");
  for (const element of texts) {
    const box = element.getBoundingClientRect();
    const style = getComputedStyle(element);
    if (style.backgroundColor && style.backgroundColor !== "rgba(0, 0, 0, 0)") {
      context.fillStyle = style.backgroundColor;
      context.fillRect(box.left - origin.left, box.top - origin.top, box.width, box.height);
    }
    context.fillStyle = style.color;
    context.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    context.textBaseline = "middle";
    context.fillText(element.textContent, box.left - origin.left, box.top - origin.top + box.height / 2);
  }
  sheet.toBlob((blob) => download(blob, name), "image/png");
}

async function exportFile(body, name) {
  const response = await call("/api/export", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  download(await response.blob(), name);
}

// --- controls shared by the views ------------------------------------------------------

function methodBoxes(container, onChange) {
  for (const method of state.info.methods) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = method;
    box.checked = method === state.info.default_method;
    box.addEventListener("change", onChange);
    // the default is the model kind's, chosen by measurement: say which and why
    if (box.checked) label.title = state.info.default_reason;
    label.append(box, ` ${method}`);
    container.append(label);
  }
}

function checkedMethods(container) {
  return [...container.querySelectorAll("input:checked")].map((box) => box.value);
}

function methodSelect(select) {
  for (const method of state.info.methods) {
    const option = new Option(method, method, false, method === state.info.default_method);
    if (option.selected) option.title = state.info.default_reason;
    select.add(option);
  }
}

function classSelect(select) {
  state.info.classes.forEach((name, index) => select.add(new Option(`${name} (${index})`, String(index))));
}

// What the model says an image shows, one part per class: its top class, or for a model
// of independent yes/no classes every class above one half, highest first (and so when
// none reaches it).
function predictionParts(prediction) {
  const named = (name, confidence) => `${name} (${(100 * confidence).toFixed(1)}%)`;
  if (!state.info.multi_label) return [named(prediction.name, prediction.confidence)];
  if (!prediction.present.length) {
    return [`no class above one half (highest: ${named(prediction.name, prediction.confidence)})`];
  }
  return prediction.present.map((c) => named(c.name, c.confidence));
}

// Empty the elements `ids`: a request that failed leaves no earlier answer on screen
// under the settings that failed.
function clear(...ids) {
  for (const id of ids) $(id).replaceChildren();
}

// The classes to explain: the one chosen, else `top` as typed (an empty box: the default,
// 1), checked by the server, which says what it takes: 0 or 1.5 is refused, never read as 1.
function targetOf(topInput, classSelectElement) {
  const chosen = classSelectElement.value;
  if (chosen !== "") return { classes: [Number(chosen)] };
  return topInput.value.trim() === "" ? {} : { top: Number(topInput.value) };
}

// --- gallery ---------------------------------------------------------------------------

async function refreshGallery() {
  state.gallery = await (await call("/api/gallery")).json();
  const { done, total } = state.gallery.progress;
  $("progress").hidden = done >= total;
  $("progress-bar").max = total;
  $("progress-bar").value = done;
  $("progress-text").textContent = `explaining the folder: ${done} of ${total}`;
  $("mistakes-label").hidden = !state.gallery.labelled;
  drawGallery();
  if (done < total) setTimeout(() => refreshGallery().catch((error) => say(error.message)), 400);
}

function drawGallery() {
  const sort = $("sort").value;
  const confidence = (item) => (item.prediction ? item.prediction.confidence : -1);
  let items = [...state.gallery.items];
  if ($("mistakes").checked) items = items.filter((item) => item.correct === false);
  if (sort === "confidence-desc") items.sort((a, b) => confidence(b) - confidence(a));
  if (sort === "confidence-asc") items.sort((a, b) => confidence(a) - confidence(b));
  const cards = items.map((item) => {
    const card = state.cards.get(item.path) || newCard(item.path);
    const verdict = card.querySelector(".verdict");
    card.classList.toggle("right", item.correct === true);
    card.classList.toggle("wrong", item.correct === false);
    if (item.error) verdict.textContent = item.error;
    else if (item.prediction) {
      const mark = item.correct === undefined ? "" : item.correct ? " ✓" : ` ✗ (${item.label})`;
      const parts = predictionParts(item.prediction).map((part) => {
        const span = document.createElement("span");
        span.className = "part"; // one class per line at most: never "cross (" / "98.0%)"
        span.textContent = part;
        return span;
      });
      verdict.replaceChildren(...parts.flatMap((span, i) => (i ? [", ", span] : [span])), mark);
      verdict.dataset.confidence = String(item.prediction.confidence);
    } else if (state.info.kind === "image") verdict.textContent = "…";
    return card;
  });
  $("gallery").replaceChildren(...cards);
  $("gallery-count").textContent = `${items.length} of ${state.gallery.items.length} images`;
}

// A gallery card, made once per image and kept: redrawing the gallery while the first
// pass fills it moves cards around without reloading their pictures.
function newCard(path) {
  const card = document.createElement("figure");
  card.className = "card";
  card.dataset.path = path;
  const picture = document.createElement("img");
  picture.src = `/api/view?item=${encodeURIComponent(path)}`;
  picture.alt = path;
  const caption = document.createElement("figcaption");
  const name = document.createElement("div");
  name.textContent = path;
  const verdict = document.createElement("div");
  verdict.className = "verdict";
  caption.append(name, verdict);
  card.append(picture, caption);
  card.tabIndex = 0;
  card.addEventListener("click", () => openItem(path));
  card.addEventListener("keydown", (event) => event.key === "Enter" && openItem(path));
  state.cards.set(path, card);
  return card;
}

function openItem(item) {
  state.item = item;
  if (state.info.kind === "clip") {
    show("clip-view");
    $("clip-title").textContent = nameOf(item);
    $("clip-results").replaceChildren();
    if ($("captions").value.trim()) busy(explainClip());
  } else {
    show("image-view");
    $("image-title").textContent = nameOf(item);
    busy(explainImage());
  }
}

async function upload(file) {
  if (!file) return;
  const response = await call("/api/upload", {
    method: "POST",
    headers: { "X-Explain-Upload": "1", "Content-Type": "application/octet-stream" },
    body: file,
  });
  const { item } = await response.json();
  state.names.set(item, file.name);
  openItem(item);
}

// --- one image -------------------------------------------------------------------------

async function explainImage() {
  const body = {
    item: state.item,
    methods: checkedMethods($("methods")),
    rule: $("rule").value,
    ...targetOf($("top"), $("class")),
  };
  const ticket = ++state.ticket;
  let answer, picture;
  try {
    [answer, picture] = await Promise.all([post("/api/explain/image", body), loadPicture(state.item)]);
  } catch (error) {
    if (ticket === state.ticket) {
      state.answer = null;
      clear("grid", "keys", "caption");
    }
    throw error;
  }
  if (ticket !== state.ticket) return;
  state.answer = answer;
  const { multi_label: multiLabel } = state.info;
  const lead = !multiLabel ? "predicted " : answer.prediction.present.length ? "present: " : "";
  $("image-prediction").textContent = lead + predictionParts(answer.prediction).join(", ");
  $("caption").textContent = answer.caption;
  drawKeys($("keys"), answer.keys);
  const cell = (entry, k) => {
    const box = document.createElement("td");
    box.dataset.method = entry.method;
    if (entry.error) {
      box.className = "error";
      box.textContent = entry.error;
      return box;
    }
    const map = entry.maps[k];
    const column = answer.classes[k];
    const canvas = mapCanvas(picture, map, `${entry.label} · ${column.name}`, $("hover"));
    canvas.dataset.method = entry.method;
    canvas.dataset.class = String(column.index);
    box.append(panel(canvas, map));
    if (map.note) {
      const note = document.createElement("div");
      note.className = "note";
      note.textContent = map.note;
      box.append(note);
    }
    return box;
  };
  const heading = (text) => {
    const head = document.createElement("th");
    head.textContent = text;
    return head;
  };
  // A method's heading as the figures write it: "rollout (class-agnostic)", the mark
  // explained on hover.
  const methodHeading = (entry) => {
    const head = heading(entry.label);
    if (entry.class_agnostic) head.title = state.info.class_agnostic;
    return head;
  };
  const className = (column) => `${column.name} (${(100 * column.confidence).toFixed(1)}%)`;
  const rows = [];
  if (answer.classes.length === 1) {
    // One class: the methods side by side, to compare them.
    const [column] = answer.classes;
    const head = document.createElement("tr");
    const maps = document.createElement("tr");
    head.append(heading(""), ...answer.methods.map(methodHeading));
    maps.append(heading(className(column)), ...answer.methods.map((entry) => cell(entry, 0)));
    rows.push(head, maps);
  } else {
    // Methods (rows) x classes (columns).
    const head = document.createElement("tr");
    head.append(heading(""), ...answer.classes.map((column) => heading(className(column))));
    rows.push(head);
    for (const entry of answer.methods) {
      const row = document.createElement("tr");
      row.append(methodHeading(entry));
      if (entry.error) {
        const error = cell(entry, 0);
        error.colSpan = answer.classes.length;
        row.append(error);
      } else row.append(...answer.classes.map((_, k) => cell(entry, k)));
      rows.push(row);
    }
  }
  $("grid").replaceChildren(...rows);
}

function imageExportBody(format) {
  const methods = checkedMethods($("methods"));
  return {
    format,
    item: state.item,
    method: methods[0] || state.info.default_method,
    classes: state.answer ? state.answer.classes.map((c) => c.index) : [],
  };
}

function stem(item) {
  return item.split("/").pop().replace(/\.[^.]*$/, "");
}

// --- text ------------------------------------------------------------------------------

async function explainText(text) {
  if (text !== undefined) $("text").value = text;
  state.text = $("text").value;
  const body = {
    text: state.text,
    methods: checkedMethods($("text-methods")),
    rule: $("text-rule").value,
    ...targetOf($("text-top"), $("text-class")),
  };
  let answer;
  try {
    answer = await post("/api/explain/text", body);
  } catch (error) {
    state.textAnswer = null;
    clear("text-results", "text-keys", "text-caption");
    throw error;
  }
  state.textAnswer = answer;
  $("text-caption").textContent = answer.caption;
  drawKeys($("text-keys"), answer.keys);
  const blocks = [];
  for (const entry of answer.methods) {
    if (entry.error) {
      const error = document.createElement("p");
      error.className = "error";
      error.textContent = `${entry.label}: ${entry.error}`;
      blocks.push(error);
      continue;
    }
    entry.maps.forEach((map, k) => {
      const column = answer.classes[k];
      const label = `${entry.label} · ${column.name} (${(100 * column.confidence).toFixed(1)}%)`;
      blocks.push(tokenRow(label, answer.tokens, map, $("text-hover")));
    });
  }
  $("text-results").replaceChildren(...blocks);
}

// A labelled row of tokens coloured by `map.display` on its scale (`map.signed`; marked
// ± with `map.marked`), reporting `map.values` on hover.
function tokenRow(label, tokens, map, readout) {
  const { values, display, signed } = map;
  const row = document.createElement("div");
  row.className = "token-row";
  row.dataset.signed = String(signed);
  const title = document.createElement("div");
  title.className = "row-label";
  title.textContent = label;
  if (map.marked) title.append(" ", signedMark());
  const line = document.createElement("div");
  line.className = "tokens";
  tokens.forEach((token, i) => {
    const span = document.createElement("span");
    span.className = "token";
    span.textContent = token;
    span.style.backgroundColor = cssColour(display[i], signed);
    span.dataset.value = String(values[i]);
    span.addEventListener("mouseenter", () => {
      readout.textContent = `${label}: ${token} = ${format(values[i])}`;
      readout.dataset.value = String(values[i]);
    });
    line.append(span);
  });
  row.append(title, line);
  return row;
}

async function listSentences(list, onPick) {
  const { sentences } = await (await call("/api/sentences")).json();
  list.replaceChildren(
    ...sentences.map((sentence) => {
      const entry = document.createElement("li");
      entry.textContent = sentence;
      entry.addEventListener("click", () => busy(onPick(sentence)));
      return entry;
    }),
  );
}

// --- generation ------------------------------------------------------------------------

async function generate(prompt) {
  if (prompt !== undefined) $("prompt").value = prompt;
  clear("gen-keys");
  let answer;
  try {
    answer = await post("/api/explain/generation", {
      prompt: $("prompt").value,
      max_new_tokens: Number($("max-new-tokens").value) || 8,
      method: $("gen-method").value,
    });
  } catch (error) {
    clear("generation", "gen-caption");
    $("gen-hover").textContent = "";
    throw error;
  }
  $("gen-caption").textContent = answer.caption;
  const spans = answer.tokens.map((token, i) => {
    const span = document.createElement("span");
    span.className = "token";
    span.textContent = token;
    span.dataset.index = String(i);
    if (i >= answer.prompt_tokens) {
      span.classList.add("generated");
      span.addEventListener("click", () => pick(i - answer.prompt_tokens));
    }
    return span;
  });
  $("generation").replaceChildren(...spans);

  // Generated token g: every token before it coloured by its relevance for g, except the
  // token g is read out at (answer.readouts[g]), hatched grey and off the scale, as in the
  // figure; what g rests on most is the server's text (explain.viz.ranking), as the
  // terminal and the figure give it.
  function pick(g) {
    const row = answer.rows[g];
    const readout = answer.readouts[g];
    const chosen = answer.tokens[answer.prompt_tokens + g];
    drawKeys($("gen-keys"), answer.keys[g]);
    spans.forEach((span, i) => {
      span.classList.toggle("chosen", i === answer.prompt_tokens + g);
      span.classList.toggle("readout-token", i === readout);
      span.style.backgroundColor = i < readout ? cssColour(answer.display[g][i], answer.signed[g]) : "";
      if (i <= readout) {
        const off = i === readout ? " (the token it is read out at: its own identity term, off the scale)" : "";
        span.dataset.value = String(row[i]);
        span.onmouseenter = () => {
          $("gen-hover").textContent = `${chosen} ← ${span.textContent} = ${format(row[i])}${off}`;
          $("gen-hover").dataset.value = String(row[i]);
        };
      } else {
        delete span.dataset.value;
        span.onmouseenter = null;
      }
    });
    $("gen-hover").textContent = `${chosen} was generated mostly from: ${answer.sources[g]}`;
  }
}

// --- CLIP ------------------------------------------------------------------------------

function captionLines() {
  return $("captions").value.split("\n").map((c) => c.trim()).filter(Boolean);
}

async function explainClip() {
  const captions = captionLines();
  let answer, picture;
  try {
    [answer, picture] = await Promise.all([
      post("/api/explain/clip", { item: state.item, captions, method: $("clip-method").value }),
      loadPicture(state.item),
    ]);
  } catch (error) {
    clear("clip-results", "clip-keys", "clip-caption");
    throw error;
  }
  $("clip-caption").textContent = answer.caption;
  drawKeys($("clip-keys"), answer.keys);
  const blocks = answer.captions.map((entry) => {
    const block = document.createElement("div");
    block.className = "clip-caption";
    const label = `${entry.caption} (p = ${entry.probability.toFixed(3)})`;
    block.append(panel(mapCanvas(picture, entry.map, label, $("clip-hover")), entry.map));
    block.append(tokenRow(label, entry.tokens, entry, $("clip-hover")));
    return block;
  });
  $("clip-results").replaceChildren(...blocks);
}

// --- start -----------------------------------------------------------------------------

async function start() {
  state.info = await (await call("/api/info")).json();
  const { kind, classes } = state.info;
  const what = { image: "image classifier", text: "text classifier", generation: "language model", clip: "image-text model" }[kind];
  const counted = classes.length ? ` · ${classes.length} classes${state.info.multi_label ? " (independent yes/no)" : ""}` : "";
  $("model").textContent = `${state.info.model} · ${what}${counted}`;
  document.body.dataset.kind = kind;
  const most = `at most ${state.info.max_tokens} tokens`;  // the server refuses longer
  $("prompt").placeholder = `Type a prompt (${most})`;
  $("text").placeholder = `Type a sentence (${most})`;
  $("captions").title = `one caption per line, each ${most}`;
  if (kind === "image" || kind === "clip") {
    show("gallery-view");
    methodBoxes($("methods"), () => busy(explainImage()));
    classSelect($("class"));
    methodSelect($("clip-method"));
    for (const id of ["top", "class", "rule"]) $(id).addEventListener("change", () => busy(explainImage()));
    $("sort").addEventListener("change", drawGallery);
    $("mistakes").addEventListener("change", drawGallery);
    $("back").addEventListener("click", () => show("gallery-view"));
    $("clip-back").addEventListener("click", () => show("gallery-view"));
    $("upload").addEventListener("change", (event) => busy(upload(event.target.files[0])));
    const drop = $("drop");
    drop.addEventListener("dragover", (event) => {
      event.preventDefault();
      drop.classList.add("over");
    });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (event) => {
      event.preventDefault();
      drop.classList.remove("over");
      busy(upload(event.dataTransfer.files[0]));
    });
    $("export-png").addEventListener("click", () => exportSheet($("image-sheet"), `${stem(nameOf(state.item))}_view.png`));
    for (const format of ["npz", "json"]) {
      $(`export-${format}`).addEventListener("click", () => {
        const body = imageExportBody(format);
        busy(exportFile(body, `${stem(nameOf(state.item))}_${body.method}.${format}`));
      });
    }
    $("explain-clip").addEventListener("click", () => busy(explainClip()));
    $("clip-export-png").addEventListener("click", () => exportSheet($("clip-sheet"), `${stem(nameOf(state.item))}_clip.png`));
    for (const format of ["npz", "json"]) {
      $(`clip-export-${format}`).addEventListener("click", () => {
        const body = { format, item: state.item, captions: captionLines(), method: $("clip-method").value };
        busy(exportFile(body, `${stem(nameOf(state.item))}_clip_${body.method}.${format}`));
      });
    }
    await refreshGallery();
  } else if (kind === "text") {
    show("text-view");
    methodBoxes($("text-methods"), () => state.text && busy(explainText()));
    classSelect($("text-class"));
    for (const id of ["text-top", "text-class", "text-rule"]) {
      $(id).addEventListener("change", () => state.text && busy(explainText()));
    }
    $("explain-text").addEventListener("click", () => busy(explainText()));
    $("text-export-png").addEventListener("click", () => exportSheet($("text-sheet"), "text_view.png"));
    for (const format of ["npz", "json"]) {
      $(`text-export-${format}`).addEventListener("click", () => {
        const methods = checkedMethods($("text-methods"));
        const body = {
          format,
          text: state.text || $("text").value,
          method: methods[0] || state.info.default_method,
          classes: state.textAnswer ? state.textAnswer.classes.map((c) => c.index) : [],
        };
        busy(exportFile(body, `text_${body.method}.${format}`));
      });
    }
    if (state.info.data === "texts") await listSentences($("sentences"), explainText);
  } else {
    show("generation-view");
    methodSelect($("gen-method"));
    $("generate").addEventListener("click", () => busy(generate()));
    $("gen-export-png").addEventListener("click", () => exportSheet($("gen-sheet"), "generation_view.png"));
    if (state.info.data === "texts") await listSentences($("gen-sentences"), generate);
  }
  document.body.dataset.ready = "true";
}

window.addEventListener("DOMContentLoaded", () => busy(start()));
