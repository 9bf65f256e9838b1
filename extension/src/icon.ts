import { LabIcon } from '@jupyterlab/ui-components';

/** A TPU chip: a die with pins on every side, drawn in the theme's icon colour. */
const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 5h10a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V7a2 2 0 0 1 2-2zm1 3v8h8V8H8z"/>
    <rect x="10" y="10" width="4" height="4"/>
    <rect x="8" y="1" width="2" height="3"/><rect x="14" y="1" width="2" height="3"/>
    <rect x="8" y="20" width="2" height="3"/><rect x="14" y="20" width="2" height="3"/>
    <rect x="1" y="8" width="3" height="2"/><rect x="1" y="14" width="3" height="2"/>
    <rect x="20" y="8" width="3" height="2"/><rect x="20" y="14" width="3" height="2"/>
  </g>
</svg>`;

export const tpuIcon = new LabIcon({ name: 'tpunb:tpu', svgstr: svg });
