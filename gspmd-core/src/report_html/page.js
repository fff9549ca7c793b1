// Expand or collapse every section; filter rows; open the sections a link points into;
// count what rendered into #rendered (checked by the headless-browser test).
(function () {
  const all = () => document.querySelectorAll("details");
  document.getElementById("expand").onclick = () => all().forEach((d) => (d.open = true));
  document.getElementById("collapse").onclick = () => all().forEach((d) => (d.open = false));
  const reveal = () => {
    const target = location.hash && document.getElementById(location.hash.slice(1));
    for (let e = target; e; e = e.parentElement) if (e.tagName === "DETAILS") e.open = true;
    if (target) target.scrollIntoView({ block: "center" });
  };
  window.addEventListener("hashchange", reveal);
  reveal();
  document.getElementById("filter").oninput = (event) => {
    const text = event.target.value.toLowerCase();
    document.querySelectorAll("table.values tr").forEach((row) => {
      const hit = text === "" || row.textContent.toLowerCase().includes(text);
      row.classList.toggle("hidden", !hit);
      if (hit && text !== "") for (let e = row; e; e = e.parentElement) if (e.tagName === "DETAILS") e.open = true;
    });
  };
  const count = (selector) => document.querySelectorAll(selector).length;
  const drawn = [...document.querySelectorAll("svg.grid use")].filter((u) => {
    const shape = document.getElementById(u.getAttribute("href").slice(1));
    return shape && shape.querySelectorAll("rect").length > 0;
  }).length;
  document.getElementById("rendered").textContent =
    `rendered: ${count("svg.grid")} device grids (${drawn} drawn), ` +
    `${count("tr.collective")} collectives, ${count("svg.chart")} charts, ${count("details.section")} sections`;
})();
